#!/bin/bash
# Session 7, call 1 (nvidia-h200): int8 values converted before the P.V layout change; sweep, kv_quant_gpu, cold-KV checks.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/kvq $R/check
git diff --stat > $R/diff.txt
timeout 200 python3 .gpu/s7_sweep1.py $R/sweep.json > $R/sweep.log 2>&1; echo "rc $?" >> $R/sweep.log; el sweep; cat $R/sweep.log | tail -25
timeout 180 python3 -m engine.bench.kv_quant_gpu --out $R/kvq > $R/kvq.log 2>&1; echo "kvq rc $?" >> $R/kvq.log
el kvq done; grep -vE "^\s*$" $R/kvq.log | tail -9 | cut -c1-400
timeout $(( 585 - ($(date +%s) - T0) )) python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_cold_kv > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check done; grep -hE "PASS|FAIL|rc |Error|Traceback" $R/check.log | cut -c1-160
tar czf $OUT/results.tgz -C $OUT r
