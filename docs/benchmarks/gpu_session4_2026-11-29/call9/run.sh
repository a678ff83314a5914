#!/bin/bash
# Session 4, call 9 (nvidia-h200): final code (pre-pass mode removed): batch-1 and the correctness checks.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/decode $R/check
timeout 150 python3 -m engine.bench.gpu_decode --out $R/decode --no-hf-compile --only batch1 > $R/decode.log 2>&1; echo "decode rc $?" >> $R/decode.log
el decode done; grep -hE "tok/s|rc |batch-1|Error|Traceback" $R/decode.log | cut -c1-700
timeout 220 python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_contexts,check_batch_invariance,check_async_scheduling,check_greedy,check_injected_failure > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check done; grep -hE "FAIL|rc |Error|Traceback" $R/check.log | cut -c1-300; grep -c PASS $R/check.log
tar czf $OUT/results.tgz -C $OUT r
tar czf $OUT/results.tgz -C $OUT r
