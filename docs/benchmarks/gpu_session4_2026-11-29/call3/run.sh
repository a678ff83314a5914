#!/bin/bash
# Session 4, call 3 (nvidia-h200): PDL levels, folded split merge, int8 dims-major values; checks + batch-1 + int8 attention.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/decode $R/check $R/kvq $R/e2e
timeout 100 python3 -m engine.bench.gemv_sweep --out $R --chain-only > $R/chain.log 2>&1; echo "chain rc $?" >> $R/chain.log
el chain done; grep -E "layers|rc |Error" $R/chain.log | cut -c1-200
timeout 100 python3 -m engine.bench.gpu_decode --out $R/decode --no-hf-compile --only batch1 > $R/decode.log 2>&1; echo "decode rc $?" >> $R/decode.log
el decode done; grep -hE "tok/s|rc |batch-1|Error|Traceback" $R/decode.log | cut -c1-700
timeout 200 python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_contexts,check_batch_invariance,check_cold_kv,check_async_scheduling > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check done; grep -hE "FAIL|rc |Error|Traceback" $R/check.log | cut -c1-300; grep -c PASS $R/check.log
timeout 150 python3 -m engine.bench.kv_quant_gpu --out $R/kvq > $R/kvq.log 2>&1; echo "kvq rc $?" >> $R/kvq.log
el kvq done; grep -vE "^\s*$" $R/kvq.log | tail -25 | cut -c1-300
timeout $(( 565 - ($(date +%s) - T0) )) python3 -m engine.bench.kv_quant_e2e --out $R/e2e > $R/e2e.log 2>&1; echo "e2e rc $?" >> $R/e2e.log
el e2e done; tail -8 $R/e2e.log | cut -c1-300
tar czf $OUT/results.tgz -C $OUT r
