#!/bin/bash
# Session 5, call 5 (nvidia-h200): final code (release after the loops by default, attention reads its inputs before the PDL wait only in the fused decoder): batch-1, checks, cold-KV attention at 32k x 8.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/decode $R/check $R/kvq
timeout 100 python3 -m engine.bench.gpu_decode --out $R/decode --no-hf-compile --only batch1 > $R/decode.log 2>&1; echo "rc $?" >> $R/decode.log
el decode; grep -hE "tok/s|rc |Error|Traceback|ceilings" $R/decode.log | cut -c1-300
timeout 120 python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_contexts,check_batch_invariance,check_cold_kv,check_async_scheduling,check_greedy,check_injected_failure > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check; grep -hE "FAIL|rc |Error|Traceback" $R/check.log | cut -c1-300; grep -c PASS $R/check.log
timeout $(( 560 - ($(date +%s) - T0) )) python3 -m engine.bench.kv_quant_gpu --out $R/kvq > $R/kvq.log 2>&1; echo "kvq rc $?" >> $R/kvq.log
el kvq; grep -vE "^\s*$" $R/kvq.log | tail -8 | cut -c1-300
tar czf $OUT/results.tgz -C $OUT r
