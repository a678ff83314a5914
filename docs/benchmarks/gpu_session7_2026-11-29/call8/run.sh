#!/bin/bash
# Session 7, call 8 (nvidia-h200): the final cold prefix kernel against the portable cold attention on other shapes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
git diff --stat > $R/diff.txt
timeout 330 python3 .gpu/s7_shapes.py $R/shapes.json > $R/shapes.log 2>&1; echo "rc $?" >> $R/shapes.log; cut -c1-230 $R/shapes.log
