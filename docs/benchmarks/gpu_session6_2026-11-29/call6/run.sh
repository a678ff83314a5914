#!/bin/bash
# Session 6, call 6 (nvidia-h200): int8 loop switches (base-2 softmax, lazy rescale, unmasked loads).
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 200 python3 .gpu/s6_sweep6.py $R/s6.json > $R/s6.log 2>&1; echo "rc $?" >> $R/s6.log; el variants; cat $R/s6.log
tar czf $OUT/results.tgz -C $OUT r
