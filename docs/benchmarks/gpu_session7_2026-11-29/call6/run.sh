#!/bin/bash
# Session 7, call 6 (nvidia-h200): int4 through the fast loop (values converted where loaded, scales ahead, base 2), launch variants.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git diff --stat > $R/diff.txt
timeout 300 python3 .gpu/s7_var4.py $R/var4.json > $R/var4.log 2>&1; echo "rc $?" >> $R/var4.log; el var4; cat $R/var4.log
