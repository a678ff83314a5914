#!/usr/bin/env bash
# The developer set-up on a Debian machine (`make setup`; `make run` and `make test` run it
# first). Idempotent, and quick once done.
# - As root: the Debian packages below, system-wide, without their recommends; the services
#   they bring are left stopped and disabled (INFERD_SETUP_KEEP_SERVICES=1 keeps them as the
#   packages set them); /usr/local/bin/inferd -> .venv/bin/inferd; the kernel-headers link
#   bcc needs. INFERD_SETUP_SYSTEM=0 skips all of this, even as root.
# - Always: .venv with the CPU build of PyTorch and the project (editable) with its test extras.
# The agent image does not run this script: Dockerfile installs the runtime alone.
set -euo pipefail
cd "$(dirname "$0")/.."

# prometheus, prometheus-alertmanager: `inferd stack up`; python3-bpfcc, bpfcc-tools,
# linux-headers-amd64: the eBPF probes and their tests; docker-compose (v1), podman, netavark,
# aardvark-dns, mmdebstrap, iproute2: the compose.yaml checks and the live compose test
# (scripts/compose_podman.py). No Docker engine: podman serves docker-compose instead.
# netavark (podman's network stack) runs iptables, only a Recommends of it; runc, since
# podman's default crun fails on hybrid cgroups
APT_PACKAGES=(prometheus prometheus-alertmanager python3-bpfcc bpfcc-tools linux-headers-amd64
              docker-compose podman runc netavark aardvark-dns iptables mmdebstrap iproute2)

# Disable (and stop, where systemd runs) the systemd units of packages installed just now.
quiet_new_services() {
    local units=() unit
    for pkg in "$@"; do
        while read -r unit; do
            unit=${unit##*/}
            if [[ $unit == *@.* ]]; then continue; fi  # templates are never enabled by themselves
            if [ "$(systemctl is-enabled "$unit" 2>/dev/null)" = enabled ]; then units+=("$unit"); fi
        done < <(dpkg -L "$pkg" 2>/dev/null | grep -E '^(/usr)?/lib/systemd/system/[^/]+\.(service|socket|timer)$' || true)
    done
    [ ${#units[@]} -gt 0 ] || return 0
    if [ -d /run/systemd/system ]; then
        systemctl disable --now --quiet "${units[@]}"
    else
        systemctl disable --quiet "${units[@]}"
    fi
    echo "setup: left stopped and disabled: ${units[*]} (start one with: systemctl enable --now NAME)"
}

system_setup() {
    local missing=() p before after wrote_policy=0
    for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -eq 0 ]; then
        echo "setup: system-wide: the Debian packages are present (${APT_PACKAGES[*]})"
    else
        echo "setup: system-wide: installing Debian packages ${missing[*]} (apt-get, no recommends)"
        before=$(dpkg-query -W -f '${Package}\n' | sort)
        # No service starts while apt-get runs (invoke-rc.d and deb-systemd-invoke ask this file).
        if [ ! -e /usr/sbin/policy-rc.d ] && [ "${INFERD_SETUP_KEEP_SERVICES:-0}" != 1 ]; then
            printf '#!/bin/sh\n# written by inferd scripts/setup.sh while apt-get runs\nexit 101\n' > /usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            wrote_policy=1
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        fi
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        if [ $wrote_policy = 1 ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
        after=$(dpkg-query -W -f '${Package}\n' | sort)
        if [ "${INFERD_SETUP_KEEP_SERVICES:-0}" != 1 ]; then
            # shellcheck disable=SC2046
            quiet_new_services $(comm -13 <(echo "$before") <(echo "$after"))
        fi
    fi
    local build
    build=/lib/modules/$(uname -r)/build
    if [ ! -e "$build" ]; then
        if scripts/link_kernel_headers.sh; then
            echo "setup: system-wide: linked $build -> $(readlink "$build") (bcc compiles against it)"
        else
            echo "setup: kernel headers not linked; eBPF tests will skip" >&2
        fi
    fi
}

link_inferd() {
    local link=/usr/local/bin/inferd target=$PWD/.venv/bin/inferd
    if [ -e "$link" ] && [ ! -L "$link" ]; then
        echo "setup: $link is not a link set-up made; left alone (this checkout's is $target)" >&2
    elif [ "$(readlink "$link" 2>/dev/null)" != "$target" ]; then
        ln -sfn "$target" "$link"
        echo "setup: system-wide: $link -> $target (inferd is on PATH)"
    fi
}

is_root=0
[ "$(id -u)" = 0 ] && [ "${INFERD_SETUP_SYSTEM:-1}" != 0 ] && command -v apt-get >/dev/null && is_root=1
if [ $is_root = 1 ]; then
    system_setup
else
    echo "setup: not root (or INFERD_SETUP_SYSTEM=0): no system packages; install them yourself: ${APT_PACKAGES[*]}" >&2
fi

# The virtual environment: redone only when pyproject.toml or this script changed.
PY=${PYTHON:-python3}
stamp=.venv/.inferd-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/inferd ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "setup: .venv is up to date"
else
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    # torch first, pinned: a bare 'torch' would pull a multi-GB CUDA build.
    .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    scripts/link_bcc.sh || echo "setup: distribution bcc not reachable from .venv; eBPF tests will skip" >&2
    echo "$want" > "$stamp"
    echo "setup: .venv ready (CPU build of torch, the project editable, test extras)"
fi

if [ $is_root = 1 ]; then
    link_inferd
elif [ "$(command -v inferd 2>/dev/null)" != "$PWD/.venv/bin/inferd" ]; then
    echo "setup: inferd is $PWD/.venv/bin/inferd; put it on PATH with: . .venv/bin/activate"
fi
