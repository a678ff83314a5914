#!/bin/bash
# Session 7, call 3 (nvidia-h200): int8 loop variants (deferred row sums, no lazy rescale, no xor), ncu source profile.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git diff --stat > $R/diff.txt
timeout 240 python3 .gpu/s7_var.py $R/var.json v_a,v_b,v_c,v_ac > $R/var.log 2>&1; echo "rc $?" >> $R/var.log; el var; cat $R/var.log
timeout 150 ncu --clock-control none --section WarpStateStats --section SourceCounters -k regex:"_cold_prefix_split_kernel" --launch-skip 2 --launch-count 1 -o $R/prof python3 .gpu/s7_ncu.py new > $R/ncu_run.txt 2>&1; echo "ncu rc $?" >> $R/ncu_run.txt
el ncu; tail -1 $R/ncu_run.txt
ncu -i $R/prof.ncu-rep --page source --csv --print-source sass > $R/source.csv 2>&1; gzip $R/source.csv
rm -f $R/prof.ncu-rep
