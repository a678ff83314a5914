#!/bin/bash
# Session 4, call 8 (nvidia-h200): throughput and batch 32 on the final code (split merge in the kernel and PDL apply to every batch size).
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R/decode
timeout 420 python3 -m engine.bench.gpu_decode --out $R/decode --no-hf-compile --only batch1,compare_fast,throughput > $R/decode.log 2>&1; echo "decode rc $?" >> $R/decode.log
grep -hE "tok/s|rc |throughput|batch-1|engine started|Error|Traceback|graph replays" $R/decode.log | cut -c1-1500
tar czf $OUT/results.tgz -C $OUT r
