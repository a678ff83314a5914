#!/usr/bin/env bash
# Make the distribution's bcc module (python3-bpfcc) importable from .venv without
# copying it or exposing the rest of dist-packages: a folder with one symlink, on a .pth.
set -euo pipefail
cd "$(dirname "$0")/.."
src=/usr/lib/python3/dist-packages/bcc
[ -d "$src" ] || { echo "python3-bpfcc not installed" >&2; exit 1; }
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p .venv/distbcc
ln -sfn "$src" .venv/distbcc/bcc
echo "$PWD/.venv/distbcc" > "$site/inferd-distbcc.pth"
