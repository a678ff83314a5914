#!/bin/bash
# Session 6, call 2 (nvidia-h200): dims-major int8 values + PTX conversion on top of tables ahead: sweep, cold-KV checks.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/check
git log --oneline -1 > $R/commit.txt; git diff --stat >> $R/commit.txt
timeout 200 python3 .gpu/s6_sweep.py $R/sweep.json > $R/sweep.log 2>&1; echo "rc $?" >> $R/sweep.log; el sweep; cat $R/sweep.log | cut -c1-200
timeout 300 python3 scripts/gpu_fastpath_check.py --out $R/check --model-sections check_cold_kv > $R/check.log 2>&1; echo "check rc $?" >> $R/check.log
el check; grep -hE "PASS|FAIL|rc |Error|Traceback" $R/check.log | cut -c1-250
tar czf $OUT/results.tgz -C $OUT r
