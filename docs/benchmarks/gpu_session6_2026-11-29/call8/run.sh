#!/bin/bash
# Session 6, call 8 (nvidia-h200): dims-major int8 values with base-2 softmax and lazy rescale (branch s6-dims-major); ncu of the first variant.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 150 python3 .gpu/s6_dm8.py $R/dm8.json > $R/dm8.log 2>&1; echo "rc $?" >> $R/dm8.log; el variants; cat $R/dm8.log
timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters -k regex:"_cold_prefix_split_kernel" --launch-skip 2 --launch-count 1 -o $R/prof python3 .gpu/s6_dm8.py x ncu > $R/ncu_run.txt 2>&1; echo "ncu rc $?" >> $R/ncu_run.txt
el ncu; tail -1 $R/ncu_run.txt
ncu -i $R/prof.ncu-rep --print-details all > $R/ncu.txt 2>&1
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|Stall (Long|Short|Wait|MIO|Barrier|Not Sel)" $R/ncu.txt | head -12
ncu -i $R/prof.ncu-rep --page source --csv --print-source sass > $R/source.csv 2>&1
tar czf $OUT/results.tgz -C $OUT r
