#!/bin/bash
# Session 6, call 4 (nvidia-h200): int8 P.V (mode 3) and register caps on dims-major + tables ahead.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 200 python3 .gpu/s6_m3.py $R/m3.json > $R/m3.log 2>&1; echo "rc $?" >> $R/m3.log; el variants; cat $R/m3.log
tar czf $OUT/results.tgz -C $OUT r
