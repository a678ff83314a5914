#!/bin/bash
# Session 6, call 10 (nvidia-h200): cost-balanced splits (hot keys weighted).
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 200 python3 .gpu/s6_hw.py $R/hw.json > $R/s6.log 2>&1; echo "rc $?" >> $R/s6.log; el variants; cat $R/s6.log
tar czf $OUT/results.tgz -C $OUT r
