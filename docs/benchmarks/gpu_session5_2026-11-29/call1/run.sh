#!/bin/bash
# Session 5, call 1 (nvidia-h200): greedy head on the GPU; batch-1 with the PDL release at exit vs after the GEMV loops; layer chain A/B; int8 tiles 128 / 64-row dots; correctness with the release after the loop.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/exit $R/loop $R/check
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 60 python3 .gpu/greedy_check.py > $R/greedy.log 2>&1; echo "rc $?" >> $R/greedy.log; el greedy; cat $R/greedy.log | grep -v "^{" | cut -c1-300
for rel in exit loop; do
  INFERD_PDL_RELEASE=$rel timeout 100 python3 -m engine.bench.gpu_decode --out $R/$rel --no-hf-compile --only batch1 > $R/$rel/decode.log 2>&1; echo "rc $?" >> $R/$rel/decode.log
  el decode $rel; grep -hE "tok/s|rc |Error|Traceback|ceilings" $R/$rel/decode.log | cut -c1-400
done
for rel in loop exit; do
  INFERD_PDL_RELEASE=$rel timeout 80 python3 -m engine.bench.gemv_sweep --out $R/$rel --chain-only > $R/$rel/chain.log 2>&1; echo "rc $?" >> $R/$rel/chain.log
  el chain $rel; grep -E "rc |Error|Traceback" $R/$rel/chain.log | cut -c1-200; grep -o '"variant": "[a-z_0-9]*", "layers": [0-9]*, "ms": [0-9.]*' $R/$rel/chain.log
done
timeout 150 python3 .gpu/int8_tiles.py > $R/int8_tiles.log 2>&1; echo "rc $?" >> $R/int8_tiles.log; el int8; grep -v "^{" $R/int8_tiles.log | cut -c1-200
left=$(( 585 - ($(date +%s) - T0) ))
INFERD_PDL_RELEASE=loop timeout $left python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_contexts,check_batch_invariance,check_async_scheduling,check_greedy,check_injected_failure > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check; grep -hE "FAIL|rc |Error|Traceback" $R/check.log | cut -c1-300; grep -c PASS $R/check.log
tar czf $OUT/results.tgz -C $OUT r
