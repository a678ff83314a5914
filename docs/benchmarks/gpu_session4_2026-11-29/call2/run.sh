#!/bin/bash
# Session 4, call 2 (nvidia-h200): fused batch-1 GEMVs + PDL: layer chain A/B, batch-1 engine/replay A/B, correctness.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/decode $R/check
timeout 120 python3 -m engine.bench.gemv_sweep --out $R --chain-only > $R/chain.log 2>&1; echo "chain rc $?" >> $R/chain.log
el chain done
grep -E "layers|rc |Error|Traceback" $R/chain.log | cut -c1-300
timeout 200 python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_contexts,check_batch_invariance > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check done
grep -hE "PASS|FAIL|rc |Error|Traceback" $R/check.log | cut -c1-300
timeout $(( 560 - ($(date +%s) - T0) )) python3 -m engine.bench.gpu_decode --out $R/decode --no-hf-compile --only batch1,profiles > $R/decode.log 2>&1; echo "decode rc $?" >> $R/decode.log
el decode done
tar czf $OUT/results.tgz -C $OUT r
grep -hE "tok/s|rc |batch-1|engine started|Error|Traceback" $R/decode.log | cut -c1-1200
head -40 $R/decode/profile_b1_ctx640.txt | cut -c1-200
