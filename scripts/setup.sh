#!/usr/bin/env bash
# One-time, idempotent set-up on a fresh Debian machine: system packages (when root),
# a virtual environment in .venv with the CPU build of PyTorch, and the project.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(prometheus prometheus-alertmanager python3-bpfcc bpfcc-tools linux-headers-amd64 docker-compose)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=()
    for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    fi
    scripts/link_kernel_headers.sh || echo "setup: kernel headers not linked; eBPF tests will skip" >&2
else
    echo "setup: not root or no apt-get; skipping system packages (${APT_PACKAGES[*]})" >&2
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first, pinned: a bare 'torch' would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
scripts/link_bcc.sh || echo "setup: distribution bcc not reachable from .venv; eBPF tests will skip" >&2
