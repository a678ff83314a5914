#!/bin/bash
# Session 6, call 5 (nvidia-h200): token-major cold kernel, tables 2/3 tiles ahead, register caps.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 200 python3 .gpu/s6_sweep5.py $R/sweep5.json > $R/sweep5.log 2>&1; echo "rc $?" >> $R/sweep5.log; el variants; cat $R/sweep5.log
tar czf $OUT/results.tgz -C $OUT r
