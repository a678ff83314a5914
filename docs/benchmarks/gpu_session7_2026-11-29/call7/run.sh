#!/bin/bash
# Session 7, call 7 (nvidia-h200): final code: kv_quant_gpu benchmark (32k x 8), cold-KV engine checks, end-to-end decode at 32k x 8.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/kvq $R/check $R/e2e
git diff --stat > $R/diff.txt
timeout 190 python3 -m engine.bench.kv_quant_gpu --out $R/kvq > $R/kvq.log 2>&1; echo "kvq rc $?" >> $R/kvq.log
el kvq done; grep -vE "^\s*$" $R/kvq.log | tail -9 | cut -c1-400
timeout 170 python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_cold_kv > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check done; grep -hE "PASS|FAIL|rc |Error|Traceback" $R/check.log | cut -c1-160
timeout $(( 585 - ($(date +%s) - T0) )) python3 -m engine.bench.kv_quant_e2e --out $R/e2e > $R/e2e.log 2>&1; echo "e2e rc $?" >> $R/e2e.log
el e2e done; tail -5 $R/e2e.log | cut -c1-400
tar czf $OUT/results.tgz -C $OUT r && rm -rf $OUT/r
