#!/bin/bash
# Session 5, call 2 (nvidia-h200): int8 P.V (mode 3, dims-major values); batch-1 with the GEMVs' first tile loaded before the PDL wait; eager per-kernel profile (PDL off).
export PYTHONPATH=. PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
R=$OUT/r; mkdir -p $R/pf0 $R/pf1 $R/prof
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 .gpu/int8_pv.py > $R/int8_pv.log 2>&1; echo "rc $?" >> $R/int8_pv.log; el int8; grep -v "^{" $R/int8_pv.log | cut -c1-220
for pf in 1 0; do
  INFERD_PDL_RELEASE=loop INFERD_GEMV_PREFETCH=$pf timeout 100 python3 -m engine.bench.gpu_decode --out $R/pf$pf --no-hf-compile --only batch1 > $R/pf$pf/decode.log 2>&1; echo "rc $?" >> $R/pf$pf/decode.log
  el decode pf$pf; grep -hE "tok/s|rc |Error|Traceback|ceilings" $R/pf$pf/decode.log | cut -c1-300
  INFERD_PDL_RELEASE=loop INFERD_GEMV_PREFETCH=$pf timeout 80 python3 -m engine.bench.gemv_sweep --out $R/pf$pf --chain-only > $R/pf$pf/chain.log 2>&1; echo "rc $?" >> $R/pf$pf/chain.log
  el chain pf$pf; grep -E "rc |Error|Traceback" $R/pf$pf/chain.log | cut -c1-200; grep -o '"variant": "[a-z_0-9]*", "layers": [0-9]*, "ms": [0-9.]*' $R/pf$pf/chain.log
done
INFERD_PDL=0 timeout 120 python3 .gpu/prof_b1.py > $R/prof/prof.log 2>&1; echo "rc $?" >> $R/prof/prof.log
el prof; cut -c1-600 $R/prof/prof.log | grep -v Warning | tail -30
tar czf $OUT/results.tgz -C $OUT r
