#!/bin/bash
# Session 7, call 5 (nvidia-h200): int8 scales loaded ahead per token (v_abt) or per block (v_abk2), against v_ab and the no-scale bound.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git diff --stat > $R/diff.txt
timeout 240 python3 .gpu/s7_var.py $R/var.json v_ab,v_abt,v_abk2,v_abs > $R/var.log 2>&1; echo "rc $?" >> $R/var.log; el var; cat $R/var.log
