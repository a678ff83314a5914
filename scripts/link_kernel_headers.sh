#!/usr/bin/env bash
# bcc compiles against /lib/modules/$(uname -r)/build. Where the running kernel has no
# headers package of its own, link the distribution's generic headers there; the
# programs only use tracepoints, so a version skew does no harm.
set -euo pipefail
mod=/lib/modules/$(uname -r)
[ -e "$mod/build" ] && exit 0
arch=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
[ -n "$arch" ] && [ -n "$common" ] || { echo "no linux-headers under /usr/src" >&2; exit 1; }
mkdir -p "$mod"
ln -sfn "$arch" "$mod/build"
ln -sfn "$common" "$mod/source"
