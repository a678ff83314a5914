#!/bin/bash
# Session 6, call 1 (nvidia-h200): int8/int4 cold attention with table entries read two tiles ahead; sweep + ncu.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 260 python3 .gpu/s6_sweep.py $R/sweep.json > $R/sweep.log 2>&1; echo "rc $?" >> $R/sweep.log; el sweep; cat $R/sweep.log | cut -c1-200
timeout 200 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section SourceCounters -k regex:"_cold_prefix_split_kernel" --launch-skip 2 --launch-count 4 -o $R/prof python3 .gpu/s6_ncu.py > $R/ncu_run.txt 2>&1; echo "ncu rc $?" >> $R/ncu_run.txt
el ncu; tail -3 $R/ncu_run.txt
ncu -i $R/prof.ncu-rep --print-details all > $R/ncu.txt 2>&1
grep -E "^  _|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Compute \(SM\) Throughput|Dynamic Shared|Block Limit Reg|Block Limit Shared|stall|Stall" $R/ncu.txt | cut -c1-160 | head -70
timeout 60 ncu -i $R/prof.ncu-rep --page source --csv --print-source sass > $R/source.csv 2>&1; echo "source rc $? $(wc -l < $R/source.csv)"
el done
tar czf $OUT/results.tgz -C $OUT r
