#!/bin/bash
# Session 5, call 6 (nvidia-h200): hot decode loop back to Triton's pipelining: attention at 32k x 8 (release loop / exit) and batch-1.
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/decode
timeout 70 python3 .gpu/attn32k.py > $R/attn32k.log 2>&1; echo "rc $?" >> $R/attn32k.log; el attn; grep -v "^{" $R/attn32k.log | tail -8
timeout 80 python3 -m engine.bench.gpu_decode --out $R/decode --no-hf-compile --only batch1 > $R/decode.log 2>&1; echo "rc $?" >> $R/decode.log
el decode; grep -hE "tok/s|rc |Error|Traceback|ceilings" $R/decode.log | cut -c1-300
tar czf $OUT/results.tgz -C $OUT r
