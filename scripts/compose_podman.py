#!/usr/bin/env python3
"""Run compose.yaml under podman on a host that has no Docker engine and reaches no
container registry (tests/test_compose.py's live test runs it; anyone may).

    scripts/compose_podman.py images              build the local images, or reuse them
    scripts/compose_podman.py up [--private-net]  images, then the stack (agent + engine on CPU,
                                                  Prometheus, Alertmanager)
    scripts/compose_podman.py exec CMD ...        run CMD in the stack's network (after --private-net)
    scripts/compose_podman.py logs                the last lines of each container's log
    scripts/compose_podman.py down                stop it; remove its containers and volumes

Needs root and Debian's podman, mmdebstrap and docker-compose (scripts/setup.sh installs
them). What it does:
- a base image from this host's Debian release (mmdebstrap, then `podman import`), since
  no registry serves python:3.11-slim or debian:bookworm-slim here;
- wheels for the image, downloaded on the host into .whl/ (pip in a container reaches no
  index), cached under ~/.cache/inferd/wheels; torch is its CPU build;
- the agent image from Dockerfile (target cpu, WHEELS=.whl) and Prometheus/Alertmanager from
  Dockerfile.monitoring, each labelled with a hash of its inputs and rebuilt only when that
  hash changes;
- `podman system service`, which docker-compose (v1) drives through its Docker API, and
  `docker-compose -f compose.yaml -f compose.podman.yaml up -d`; the override swaps the image
  sources and leaves out Grafana and the OpenTelemetry Collector, which have no package here.
With --private-net the service runs in a network namespace of its own, so the stack's
host-network services take that namespace's loopback ports, not the host's.

podman's settings go in a containers.conf of this script's own (no rlimits set in the
sandbox, runc as the runtime): CONTAINERS_CONF points at it unless already set. State,
logs and the API socket live in .out/podman (INFERD_PODMAN_DIR).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import install_deps  # scripts/install_deps.py: what the image installs, and in what order

install_deps.PREFIX = "compose_podman:"

REPO = Path(__file__).resolve().parents[1]
PROJECT = os.environ.get("COMPOSE_PROJECT_NAME", "inferd")
STATE = Path(os.environ.get("INFERD_PODMAN_DIR", REPO / ".out" / "podman"))
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
BASE_IMAGE = "localhost/inferd-local/debian:{suite}"
AGENT_IMAGE = "localhost/inferd:cpu"
MONITORING_IMAGE = "localhost/inferd-local/monitoring:debian"
HASH_LABEL = "inferd.content-hash"
CONTEXT_DIRS = ("agent", "engine", "exporters", "ebpf", "dashboards")  # what Dockerfile copies
CONTEXT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "scripts/install_deps.py")
NEEDED = ("podman", "mmdebstrap", "docker-compose", "unshare", "nsenter", "ip")


class Unavailable(RuntimeError):
    """podman cannot run containers on this host (the reason is the message)."""


def log(message: str) -> None:
    print(f"compose_podman: {message}", file=sys.stderr, flush=True)


def check_host() -> None:
    if os.geteuid() != 0:
        raise Unavailable(
            "podman runs containers here only as root (rootless podman needs subuids and "
            "user namespaces this host does not offer)"
        )
    missing = [b for b in NEEDED if shutil.which(b) is None]
    if missing:
        raise Unavailable(
            f"not installed: {', '.join(missing)} (scripts/setup.sh installs podman, mmdebstrap, "
            "docker-compose as root)"
        )


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        STATE.mkdir(parents=True, exist_ok=True)
        conf = STATE / "containers.conf"
        # rlimits cannot be set inside the sandbox here ("error setting rlimit type 7");
        # crun fails on hybrid cgroups where runc works.
        runtime = '\n[engine]\nruntime = "runc"\n' if shutil.which("runc") else ""
        conf.write_text(f"[containers]\ndefault_ulimits = []\n{runtime}")
        env["CONTAINERS_CONF"] = str(conf)
    return env


def sh(*argv: str, env: dict | None = None, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        argv,
        env=env or podman_env(),
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if check and result.returncode != 0:
        detail = f"\n{result.stderr}" if capture else ""
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {result.returncode}{detail}")
    return result


def image_label(image: str) -> str | None:
    result = sh("podman", "image", "inspect", image, capture=True, check=False)
    if result.returncode != 0:
        return None
    return (json.loads(result.stdout)[0].get("Labels") or {}).get(HASH_LABEL)


def image_id(image: str) -> str:
    return sh("podman", "image", "inspect", "--format", "{{.Id}}", image, capture=True).stdout.strip()


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


# ---- images -----------------------------------------------------------------------------


def host_suite() -> str:
    text = Path("/etc/os-release").read_text()
    match = re.search(r"^VERSION_CODENAME=(\S+)", text, flags=re.M)
    if match is None:
        raise Unavailable("not a Debian host (/etc/os-release names no VERSION_CODENAME); mmdebstrap needs one")
    return match.group(1).strip('"')


def base_image() -> str:
    suite = host_suite()
    name = BASE_IMAGE.format(suite=suite)
    want = digest(suite, *BASE_PACKAGES)
    if image_label(name) == want:
        return name
    log(f"building {name} with mmdebstrap ({', '.join(BASE_PACKAGES)})")
    STATE.mkdir(parents=True, exist_ok=True)
    tar = STATE / f"rootfs-{suite}.tar"
    try:
        sh("mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(tar))
        sh("podman", "import", "--quiet", "--change", f"LABEL {HASH_LABEL}={want}", str(tar), name, capture=True)
    finally:
        tar.unlink(missing_ok=True)
    return name


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)", (REPO / "Dockerfile").read_text(), flags=re.M)
    if match is None:
        raise RuntimeError(f"Dockerfile sets no default for ARG {name}")
    return match.group(1)


def torch_requirement() -> str:
    # the CPU build by its local version: only that wheel can match, never a CUDA build
    return f"torch=={dockerfile_arg('TORCH_VERSION')}+cpu"


def wheel_requirements() -> list[str]:
    """What the wheels folder is made from: torch, the run set as scripts/install_deps.py
    installs it (a step that reads a package's own requirements is named by them), and the
    build backend that makes the project's wheel."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    described = []
    for step in install_deps.plan("run", pyproject):
        if step.requirements_of:
            described.append(f"<requirements of {step.requirements_of} less {','.join(step.skip)}>")
        described += [("--no-deps " if step.no_deps else "") + r for r in step.requirements]
    return [torch_requirement(), *described, *pyproject["build-system"]["requires"], "wheel"]


def base_python(base: str) -> str:
    out = sh(
        "podman",
        "run",
        "--rm",
        base,
        "python3",
        "-c",
        "import sys; print('%d.%d' % sys.version_info[:2])",
        capture=True,
    ).stdout
    return out.strip()


def ensure_wheels(base: str) -> Path:
    """The wheels the image installs, in .whl/ (hard links into the cache when it can)."""
    requirements = wheel_requirements()
    python = base_python(base)
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferd" / "wheels"
    cache = cache_root / digest(python, *requirements)[:16]
    if not cache.is_dir():
        log(f"downloading the image's wheels for Python {python} into {cache}")
        cache_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".tmp-"))
        try:
            pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
            other = None if python == "{}.{}".format(*sys.version_info[:2]) else python
            pip_log = STATE / "pip-download.log"
            STATE.mkdir(parents=True, exist_ok=True)
            steps = install_deps.plan("run", pyproject, torch_requirement())
            install_deps.download(steps, tmp, other, pip_log)
            build = [*pyproject["build-system"]["requires"], "wheel"]
            install_deps.download([install_deps.Step("the build backend", build)], tmp, other, pip_log)
            tmp.rename(cache)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    target = REPO / ".whl"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    for wheel in cache.iterdir():
        try:
            os.link(wheel, target / wheel.name)
        except OSError:
            shutil.copy2(wheel, target / wheel.name)
    return target


def tree_digest() -> str:
    """A hash of everything the agent image is built from (the build context as Dockerfile
    copies it), so an unchanged tree reuses the image."""
    parts: list[str | bytes] = []
    for name in CONTEXT_FILES:
        parts += [name, (REPO / name).read_bytes()]
    for path in sorted((REPO / "inferd").glob("*.py")):  # the namespace's own modules
        parts += [str(path.relative_to(REPO)), path.read_bytes()]
    for top in CONTEXT_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                parts += [str(path.relative_to(REPO)), path.read_bytes()]
    return digest(*parts)


def agent_image(base: str) -> str:
    want = digest(tree_digest(), image_id(base), *wheel_requirements())
    if image_label(AGENT_IMAGE) == want:
        log(f"{AGENT_IMAGE} is up to date")
        return AGENT_IMAGE
    ensure_wheels(base)
    log(f"building {AGENT_IMAGE} (Dockerfile, target cpu, from {base}, wheels from .whl/)")
    sh(
        "podman",
        "build",
        "--quiet",
        "--target",
        "cpu",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        "WHEELS=.whl",
        "--label",
        f"{HASH_LABEL}={want}",
        "--tag",
        AGENT_IMAGE,
        str(REPO),
    )
    return AGENT_IMAGE


def monitoring_image(base: str) -> str:
    dockerfile = REPO / "Dockerfile.monitoring"
    want = digest(dockerfile.read_bytes(), image_id(base))
    if image_label(MONITORING_IMAGE) == want:
        log(f"{MONITORING_IMAGE} is up to date")
        return MONITORING_IMAGE
    log(f"building {MONITORING_IMAGE} (Dockerfile.monitoring: Debian's prometheus and prometheus-alertmanager)")
    with tempfile.TemporaryDirectory() as empty:  # it copies nothing: an empty context
        sh(
            "podman",
            "build",
            "--quiet",
            "--file",
            str(dockerfile),
            "--build-arg",
            f"BASE_IMAGE={base}",
            "--label",
            f"{HASH_LABEL}={want}",
            "--tag",
            MONITORING_IMAGE,
            empty,
        )
    return MONITORING_IMAGE


def images() -> dict[str, str]:
    check_host()
    base = base_image()
    built = {
        "INFERD_BASE_IMAGE": base,
        "INFERD_AGENT_IMAGE": agent_image(base),
        "INFERD_MONITORING_IMAGE": monitoring_image(base),
    }
    for image in built.values():
        size = int(sh("podman", "image", "inspect", "--format", "{{.Size}}", image, capture=True).stdout)
        log(f"{image:<45} {size / 1e6:,.0f} MB")
    return built


# ---- the stack ----------------------------------------------------------------------------


def service_pid() -> int | None:
    try:
        pid = int((STATE / "service.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def start_service(private_net: bool) -> None:
    if service_pid() is not None:
        return
    STATE.mkdir(parents=True, exist_ok=True)
    sock = STATE / "podman.sock"
    sock.unlink(missing_ok=True)
    serve = f"exec podman system service --time=0 unix://{sock}"
    argv = (
        ["unshare", "--net", "--", "sh", "-c", f"ip link set lo up && {serve}"] if private_net else ["sh", "-c", serve]
    )
    with open(STATE / "service.log", "ab") as out:
        process = subprocess.Popen(
            argv,
            env=podman_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (STATE / "service.pid").write_text(f"{process.pid}\n")
    deadline = time.monotonic() + 30
    while not sock.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"podman system service did not start; see {STATE / 'service.log'}")
        time.sleep(0.1)


def stop_service() -> None:
    pid = service_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    (STATE / "service.pid").unlink(missing_ok=True)


def compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**podman_env(), **(env or {}), "DOCKER_HOST": f"unix://{STATE / 'podman.sock'}"}
    return sh(
        "docker-compose",
        "--project-name",
        PROJECT,
        "--project-directory",
        str(REPO),
        "--file",
        str(REPO / "compose.yaml"),
        "--file",
        str(REPO / "compose.podman.yaml"),
        *args,
        env=env,
    )


def project_containers() -> list[str]:
    out = sh(
        "podman", "ps", "--all", "--quiet", "--filter", f"label=com.docker.compose.project={PROJECT}", capture=True
    ).stdout
    return out.split()


def up(private_net: bool) -> None:
    built = images()
    if service_pid() is not None or project_containers():
        log(f"stopping what is left of an earlier {PROJECT} stack")
        down()
    start_service(private_net)
    (STATE / "images.json").write_text(json.dumps(built, indent=2) + "\n")
    compose("up", "--detach", "--no-build", env=built)
    where = (
        "in the stack's network namespace (`scripts/compose_podman.py exec curl ...`)"
        if private_net
        else "on this host"
    )
    log(
        f"up {where}: engine http://localhost:8000/v1, agent :10400, Prometheus :9090, Alertmanager :9093; "
        "stop with `scripts/compose_podman.py down`"
    )


def down() -> None:
    check_host()
    try:
        built = json.loads((STATE / "images.json").read_text())
    except FileNotFoundError:
        built = {}
    if service_pid() is None and (STATE / "podman.sock").exists():
        (STATE / "podman.sock").unlink()
    if service_pid() is None:
        start_service(private_net=False)  # down only needs the API, not the stack's network
    try:
        compose("down", "--volumes", "--remove-orphans", "--timeout", "50", env=built)
    finally:
        stop_service()
        (STATE / "images.json").unlink(missing_ok=True)


def logs() -> None:
    for container in project_containers():
        name = sh("podman", "inspect", "--format", "{{.Name}}", container, capture=True).stdout.strip()
        result = sh("podman", "logs", "--tail", "40", container, capture=True, check=False)
        print(f"---- {name}")
        print((result.stdout + result.stderr).rstrip())


def nsexec(argv: list[str]) -> int:
    pid = service_pid()
    if pid is None:
        raise RuntimeError("no stack running (scripts/compose_podman.py up --private-net first)")
    return subprocess.call(["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("images", help="build the local images, or reuse them")
    p_up = sub.add_parser("up", help="images, then the stack")
    p_up.add_argument(
        "--private-net",
        action="store_true",
        help="run the stack in a network namespace of its own (its ports are not the host's)",
    )
    sub.add_parser("logs", help="the last lines of each container's log")
    sub.add_parser("down", help="stop the stack; remove its containers and volumes")
    p_exec = sub.add_parser("exec", help="run a command in the stack's network namespace")
    p_exec.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.action == "images":
            images()
        elif args.action == "up":
            up(args.private_net)
        elif args.action == "down":
            down()
        elif args.action == "logs":
            logs()
        else:
            return nsexec(args.command)
    except Unavailable as exc:
        log(f"cannot run: {exc}")
        return 2
    except RuntimeError as exc:
        log(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
