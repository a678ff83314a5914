#!/bin/bash
# Session 7, call 4 (nvidia-h200): deferred row sums with and without lazy rescale; upper bounds without scale loads (wrong values, timing only).
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git diff --stat > $R/diff.txt
timeout 240 python3 .gpu/s7_var.py $R/var.json v_a,v_ab,v_as,v_abs,v_ac > $R/var.log 2>&1; echo "rc $?" >> $R/var.log; el var; cat $R/var.log
