#!/bin/bash
# Session 6, call 3 (nvidia-h200): why the dims-major int8 kernel is slower: variants + ncu with shared-memory and stall detail.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 120 python3 .gpu/s6_dm.py > $R/dm.log 2>&1; echo "rc $?" >> $R/dm.log; el variants; cat $R/dm.log
timeout 200 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis_Tables -k regex:"_cold_prefix_split_kernel" --launch-skip 2 --launch-count 1 -o $R/prof python3 .gpu/s6_dm.py ncu > $R/ncu_run.txt 2>&1; echo "ncu rc $?" >> $R/ncu_run.txt
el ncu; tail -2 $R/ncu_run.txt
ncu -i $R/prof.ncu-rep --print-details all > $R/ncu.txt 2>&1
grep -E "Duration|DRAM Throughput|Registers Per|Warp Cycles Per Issued|Stall [A-Z]|Bank|bank|Shared" $R/ncu.txt | cut -c1-160 | head -40
ncu -i $R/prof.ncu-rep --page source --csv --print-source sass > $R/source.csv 2>&1
el done
tar czf $OUT/results.tgz -C $OUT r
