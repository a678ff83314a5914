#!/bin/bash
# Session 4, call 4 (nvidia-h200): one-pass RMS in the GEMVs, one-tile gate/up; chain + batch-1 A/B, checks, ncu of the kernels.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/decode $R/check
timeout 90 python3 -m engine.bench.gemv_sweep --out $R --chain-only > $R/chain.log 2>&1; echo "chain rc $?" >> $R/chain.log
el chain done; grep -E "layers|rc |Error" $R/chain.log | cut -c1-170
timeout 100 python3 -m engine.bench.gpu_decode --out $R/decode --no-hf-compile --only batch1 > $R/decode.log 2>&1; echo "decode rc $?" >> $R/decode.log
el decode done; grep -hE "tok/s|rc |batch-1|Error|Traceback" $R/decode.log | cut -c1-700
timeout 150 python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_contexts,check_batch_invariance,check_async_scheduling > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check done; grep -hE "FAIL|rc |Error|Traceback" $R/check.log | cut -c1-300; grep -c PASS $R/check.log
timeout 200 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis -k regex:"_cold_prefix_split_kernel|_decode_split_kernel|_gemv_kernel" --launch-skip 2 --launch-count 8 python3 .gpu/ncu_kernels.py > $R/ncu.txt 2>&1; echo "ncu rc $?" >> $R/ncu.txt
el ncu done; grep -E "^  _|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Compute \(SM\) Throughput|Stall|rc " $R/ncu.txt | cut -c1-150 | head -120
tar czf $OUT/results.tgz -C $OUT r
