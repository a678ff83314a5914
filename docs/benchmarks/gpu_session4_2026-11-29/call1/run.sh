#!/bin/bash
# Session 4, call 1 (nvidia-h200): batch-1 GEMV sweep (Triton vs cuBLAS) and the fused layer chain.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/gpu.txt
timeout 420 python3 -m engine.bench.gemv_sweep --out $R --budget-s 300 > $R/sweep.log 2>&1; echo "sweep rc $?" >> $R/sweep.log
tar czf $OUT/results.tgz -C $OUT r
cat $R/gpu.txt; grep -E "copy|cublas|best|layers|fused|rc |Error|Traceback" $R/sweep.log | cut -c1-400
grep '"gemv"' $R/sweep.log | python3 -c "
import sys, json, collections
by = collections.defaultdict(list)
for l in sys.stdin:
    r = json.loads(l)
    if 'us' in r: by[r['shape']].append((r['us'], r['config'], round(r['of_copy'],3)))
for s, v in by.items():
    v.sort(); print(s, v[:6], 'worst', v[-1])
"
