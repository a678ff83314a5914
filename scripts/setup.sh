#!/usr/bin/env bash
# The developer set-up on a Debian machine. Idempotent, and quick once done.
#   scripts/setup.sh         what `make run` runs (make setup)
#   scripts/setup.sh --test  that, then what the tests and linters need (make test, make lint)
# - As root: the Debian packages below, system-wide, without their recommends (--test adds the
#   container tools); the services they bring are left stopped and disabled
#   (INFERD_SETUP_KEEP_SERVICES=1 keeps them as the packages set them);
#   /usr/local/bin/inferd -> .venv/bin/inferd; the kernel-headers link bcc needs.
#   INFERD_SETUP_SYSTEM=0 skips all of this, even as root.
# - Always: .venv with the CPU build of PyTorch, the project (editable) and what it runs
#   (scripts/install_deps.py run); with --test, the test extras on top (install_deps.py test).
#   pip's whole output goes to .venv/setup-pip.log.
# The agent image does not run this script: Dockerfile runs scripts/install_deps.py itself.
set -euo pipefail
cd "$(dirname "$0")/.."

# prometheus, prometheus-alertmanager: `inferd stack up`; python3-bpfcc, bpfcc-tools,
# linux-headers-amd64: the agent's eBPF probes (and their tests)
APT_PACKAGES=(prometheus prometheus-alertmanager python3-bpfcc bpfcc-tools linux-headers-amd64)
# --test: docker-compose (v1), podman, netavark, aardvark-dns, mmdebstrap, iproute2: the
# compose.yaml checks and the live compose test (scripts/compose_podman.py). No Docker engine:
# podman serves docker-compose instead. netavark (podman's network stack) runs iptables, only a
# Recommends of it; runc, since podman's default crun fails on hybrid cgroups
APT_TEST_PACKAGES=(docker-compose podman runc netavark aardvark-dns iptables mmdebstrap iproute2)

with_tests=0
case "${1:-}" in
    --test) with_tests=1; APT_PACKAGES+=("${APT_TEST_PACKAGES[@]}") ;;
    "") ;;
    *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

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

# The virtual environment: each part redone only when pyproject.toml or the set-up scripts
# changed. torch first, pinned: a bare 'torch' would pull a multi-GB CUDA build.
PY=${PYTHON:-python3}
TORCH=torch==2.13.0
want=$(cat pyproject.toml scripts/setup.sh scripts/install_deps.py | sha256sum | cut -d' ' -f1)
pip_log=$PWD/.venv/setup-pip.log
if [ -x .venv/bin/inferd ] && [ "$(cat .venv/.inferd-setup 2>/dev/null)" = "$want" ]; then
    echo "setup: .venv is up to date (what inferd runs)"
else
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    rm -f .venv/.inferd-setup .venv/.inferd-setup-test
    echo "setup: .venv: the CPU build of torch, then what inferd runs; pip's output: $pip_log"
    .venv/bin/python scripts/install_deps.py run --torch "$TORCH" --log "$pip_log"
    # the project itself, editable; its dependencies are in already
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e . >>"$pip_log" 2>&1 \
        || { tail -20 "$pip_log" >&2; echo "setup: pip install -e . failed; see $pip_log" >&2; exit 1; }
    scripts/link_bcc.sh || echo "setup: distribution bcc not reachable from .venv; eBPF probes stay off" >&2
    echo "$want" > .venv/.inferd-setup
    echo "setup: .venv ready for make run ($(du -sh .venv | cut -f1): the CPU build of torch, the project editable, what it runs)"
fi
if [ $with_tests = 1 ]; then
    if [ "$(cat .venv/.inferd-setup-test 2>/dev/null)" = "$want" ]; then
        echo "setup: .venv has the test extras"
    else
        .venv/bin/python scripts/install_deps.py test --log "$pip_log"
        echo "$want" > .venv/.inferd-setup-test
        echo "setup: .venv ready for make test and make lint ($(du -sh .venv | cut -f1), test extras included)"
    fi
fi

if [ $is_root = 1 ]; then
    link_inferd
elif [ "$(command -v inferd 2>/dev/null)" != "$PWD/.venv/bin/inferd" ]; then
    echo "setup: inferd is $PWD/.venv/bin/inferd; put it on PATH with: . .venv/bin/activate"
fi
