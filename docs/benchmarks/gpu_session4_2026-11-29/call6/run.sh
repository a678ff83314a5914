#!/bin/bash
# Session 4, call 6 (nvidia-h200): GEMV launch-shape sweep, plain and fused (one-pass RMS, one-tile gate/up).
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 400 python3 -m engine.bench.gemv_sweep --out $R --fused-sweep --budget-s 330 > $R/sweep.log 2>&1; echo "sweep rc $?" >> $R/sweep.log
grep -E "rc |Error|Traceback|layers" $R/sweep.log | cut -c1-200
python3 - <<'PY'
import json, collections
rows = json.load(open("/root/out.json")) if False else [json.loads(l) for l in open(__import__("os").environ["OUT"] + "/r/sweep.log") if l.startswith("{")]
by = collections.defaultdict(list)
for r in rows:
    if r.get("us") and r["kind"] in ("gemv", "fused", "cublas"):
        by[(r["kind"], r["shape"])].append((round(r["us"], 2), r.get("config", "")[10:].replace("block_", "").replace("num_", "")))
for key, v in sorted(by.items()):
    v.sort(); print(key, v[:4])
PY
