#!/bin/bash
# Session 5, call 4 (nvidia-h200): group merge, table loads before the PDL wait; eager profile; batch-1 exit vs loop release; checks under both; throughput.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/exit $R/loop $R/prof $R/thr
INFERD_PDL=0 timeout 100 python3 .gpu/prof_b1.py > $R/prof/prof.log 2>&1; echo "rc $?" >> $R/prof/prof.log
el prof; grep -v Warning $R/prof/prof.log | tail -5 | cut -c1-700
for rel in loop exit; do
  INFERD_PDL_RELEASE=$rel timeout 100 python3 -m engine.bench.gpu_decode --out $R/$rel --no-hf-compile --only batch1 > $R/$rel/decode.log 2>&1; echo "rc $?" >> $R/$rel/decode.log
  el decode $rel; grep -hE "tok/s|rc |Error|Traceback|ceilings" $R/$rel/decode.log | cut -c1-300
  INFERD_PDL_RELEASE=$rel timeout 100 python3 scripts/gpu_fastpath_check.py --out $R/$rel --model-sections check_contexts,check_batch_invariance,check_async_scheduling,check_greedy,check_injected_failure > $R/$rel/check.log 2>&1; echo "check rc $?" >> $R/$rel/check.log
  el check $rel; grep -hE "FAIL|rc |Error|Traceback" $R/$rel/check.log | cut -c1-300; grep -c PASS $R/$rel/check.log
done
left=$(( 580 - ($(date +%s) - T0) ))
timeout $left python3 -m engine.bench.gpu_decode --out $R/thr --no-hf-compile --only throughput,compare_fast > $R/thr/decode.log 2>&1; echo "rc $?" >> $R/thr/decode.log
el thr; grep -hE "tok/s|rc |Error|Traceback|throughput|ceilings|graph replays" $R/thr/decode.log | cut -c1-900
tar czf $OUT/results.tgz -C $OUT r
