#!/bin/bash
# Session 4, call 10 (nvidia-h200): torch profiler over 64 engine decode steps at batch 1.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 200 python3 .gpu/engine_step_profile.py > $R/engine_step_profile.txt 2>&1; echo "rc $?" >> $R/engine_step_profile.txt
grep -vE "^\s*$" $R/engine_step_profile.txt | cut -c1-230 | tail -45
