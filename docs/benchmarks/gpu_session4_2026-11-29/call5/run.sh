#!/bin/bash
# Session 4, call 5 (nvidia-h200): int8/int4 cold-prefix kernel launch shapes with smaller per-program footprints.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 280 python3 .gpu/int8_configs.py > $R/int8_configs.log 2>&1; echo "rc $?" >> $R/int8_configs.log
cat $R/int8_configs.log | grep -v "^{" | cut -c1-200
