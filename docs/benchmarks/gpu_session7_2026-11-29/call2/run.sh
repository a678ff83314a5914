#!/bin/bash
# Session 7, call 2 (nvidia-h200): ncu of the int8 cold-prefix kernel, session 7's and session 6's.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git diff --stat > $R/diff.txt
for which in new old; do
  timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters --section ComputeWorkloadAnalysis -k regex:"_cold_prefix_split_kernel" --launch-skip 2 --launch-count 1 -o $R/prof_$which python3 .gpu/s7_ncu.py $which > $R/ncu_run_$which.txt 2>&1; echo "ncu rc $?" >> $R/ncu_run_$which.txt
  el ncu $which; tail -1 $R/ncu_run_$which.txt
  ncu -i $R/prof_$which.ncu-rep --print-details all > $R/ncu_$which.txt 2>&1
  ncu -i $R/prof_$which.ncu-rep --page source --csv --print-source sass > $R/source_$which.csv 2>&1
  grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Dynamic Shared|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Mem Pipes Busy)" $R/ncu_$which.txt | head -40
done
tar czf $OUT/results.tgz -C $OUT r
