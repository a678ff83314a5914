#!/usr/bin/env python3
"""Install inferd's Python dependencies into the environment of the Python that runs this
script (scripts/setup.sh runs it with .venv/bin/python, Dockerfile with the image's venv).

    install_deps.py run  [--torch SPEC]   what inferd runs: pyproject.toml's dependencies
    install_deps.py test                  the test extras, on top of `run` (make test, make lint)
    install_deps.py run --list            print the steps and their requirements; install nothing
    install_deps.py run --download DIR [--torch SPEC] [--python-version X.Y]
                                          the `run` set's wheels into DIR (scripts/compose_podman.py)

torch comes first and pinned (--torch, or already installed): no step here ever hands pip a
bare or open-ended `torch`, which would resolve to a multi-GB CUDA build.

`[tool.inferd.install.without]` in pyproject.toml names dependencies that go in without some
requirements of their own, which inferd never runs: the package with --no-deps, then the rest
of its requirements (read from its metadata). pip check then reports those as missing; nothing
else may be.

Each step says what it installs and about how long it took on a fresh 2-core machine, prints
a line of progress every 15 s while pip works, and keeps pip's whole output in --log.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the copy pip carries
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
except ModuleNotFoundError:  # a bare venv: the copy pip carries
    from pip._vendor.packaging.markers import default_environment  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
PREFIX = "setup:"
HEARTBEAT_S = 15.0


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(spec: str) -> str:
    return canonical(Requirement(spec).name)


@dataclass(slots=True)
class Step:
    """One pip call. `requirements_of` names an installed (or downloaded) package whose own
    requirements, less `skip` and torch, are this step's requirements."""

    what: str
    requirements: list[str] = field(default_factory=list)
    no_deps: bool = False
    requirements_of: str | None = None
    skip: tuple[str, ...] = ()
    minutes: float = 0.0  # about how long it took on a fresh 2-core machine


def load_pyproject(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def plan(mode: str, pyproject: dict, torch: str | None = None) -> list[Step]:
    """The pip calls for `run` or `test`, in order."""
    if mode == "test":
        extras = pyproject["project"]["optional-dependencies"]["test"]
        return [
            Step("the test extras (pytest, ruff, mypy, lm-eval, triton, transformers, ...)", list(extras), minutes=1)
        ]
    without = {
        canonical(k): tuple(v)
        for k, v in pyproject.get("tool", {}).get("inferd", {}).get("install", {}).get("without", {}).items()
    }
    deps = [d for d in pyproject["project"]["dependencies"] if req_name(d) != "torch"]
    steps = []
    if torch:
        steps.append(Step(f"{torch} (about 750 MB unpacked)", [torch], minutes=0.5))
    steps.append(
        Step(
            "the dependencies in pyproject.toml",
            [d for d in deps if req_name(d) not in without],
            minutes=1,
        )
    )
    for dep in deps:
        name = req_name(dep)
        if name in without:
            skipped = ", ".join(without[name])
            steps.append(Step(f"{name} without its requirements", [dep], no_deps=True, minutes=0.1))
            steps.append(
                Step(
                    f"{name}'s requirements less {skipped}",
                    requirements_of=name,
                    skip=without[name],
                    minutes=0.5,
                )
            )
    return steps


def requirements_from_metadata(requires: list[str], skip: tuple[str, ...], environment: dict[str, str]) -> list[str]:
    """A package's Requires-Dist that apply here (no extras), less `skip` and torch."""
    dropped = {canonical(s) for s in skip} | {"torch"}
    out = []
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**environment, "extra": ""}):
            continue
        if canonical(req.name) not in dropped:
            out.append(line.split(";")[0].strip())
    return out


def installed_requires(name: str) -> list[str]:
    importlib.invalidate_caches()
    return importlib.metadata.requires(name) or []


def wheel_requires(folder: Path, name: str) -> list[str]:
    wheels = [w for w in folder.glob("*.whl") if canonical(w.name.split("-")[0]) == name]
    if not wheels:
        raise SystemExit(f"{PREFIX} no {name} wheel in {folder}")
    with zipfile.ZipFile(max(wheels)) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(archive.read(meta).decode())
    return message.get_all("Requires-Dist") or []


def log(message: str) -> None:
    print(f"{PREFIX} {message}", flush=True)


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def pip(argv: list[str], what: str, minutes: float, log_path: Path) -> None:
    """Run pip, printing a line of progress every HEARTBEAT_S seconds and when it starts
    installing; its whole output goes to log_path (the tail is printed if it fails)."""
    about = f"about {minutes:g} min" if minutes >= 1 else "under a minute"
    log(f"{argv[0]}ing {what}: {about} on a fresh 2-core machine")
    command = [sys.executable, "-m", "pip", *argv, "--disable-pip-version-check", "--progress-bar", "off"]
    state = {"collected": 0, "now": "resolving"}
    started = time.monotonic()
    with open(log_path, "a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                out.write(line)
                text = line.strip()
                if text.startswith(("Collecting ", "Processing ")):
                    state["collected"] += 1
                    state["now"] = text.split(" (")[0].lower()
                elif text.startswith("Downloading "):
                    state["now"] = "downloading " + text.split()[1].split("/")[-1] + " " + " ".join(text.split()[2:])
                elif text.startswith("Installing collected packages:"):
                    names = text.split(":", 1)[1].split(",")
                    state["now"] = f"unpacking {len(names)} package(s)"
                    log(
                        f"  {clock(time.monotonic() - started)} unpacking {len(names)} package(s): {', '.join(n.strip() for n in names[:8])}{', ...' if len(names) > 8 else ''}"
                    )

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while reader.is_alive():  # until pip closes its output
            reader.join(timeout=HEARTBEAT_S)
            if reader.is_alive():
                log(f"  {clock(time.monotonic() - started)} {state['collected']} collected; {state['now']}")
        process.wait()
    if process.returncode != 0:
        tail = log_path.read_text().splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        raise SystemExit(f"{PREFIX} pip failed installing {what} (exit {process.returncode}); its output: {log_path}")
    log(f"  done in {clock(time.monotonic() - started)}")


def check(steps: list[Step], log_path: Path) -> None:
    """pip check, less the requirements left out on purpose; then import what was trimmed."""
    allowed = {(s.requirements_of, canonical(k)) for s in steps if s.requirements_of for k in s.skip}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "check", "--disable-pip-version-check"], capture_output=True, text=True
    )
    problems = []
    for line in result.stdout.splitlines():
        match = re.match(r"(\S+) \S+ requires (\S+?),? which is not installed", line)
        if match and (canonical(match.group(1)), canonical(match.group(2))) in allowed:
            continue
        if line.strip() and line.strip() != "No broken requirements found.":
            problems.append(line)
    if problems:
        log("pip check reports (left as they are):\n  " + "\n  ".join(problems))
    for step in steps:
        if step.requirements_of:
            name = step.requirements_of.replace("-", "_")
            probe = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True)
            if probe.returncode != 0:
                print(probe.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{PREFIX} {name} does not import without {', '.join(step.skip)}; see above")
            log(f"  {name} imports without {', '.join(step.skip)}")


def has_torch() -> bool:
    try:
        importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def install(steps: list[Step], log_path: Path) -> None:
    for step in steps:
        requirements = step.requirements
        if step.requirements_of:
            requirements = requirements_from_metadata(
                installed_requires(step.requirements_of), step.skip, default_environment()
            )
        if not requirements:
            continue
        pip(["install", *(["--no-deps"] if step.no_deps else []), *requirements], step.what, step.minutes, log_path)
    check(steps, log_path)


def download(steps: list[Step], dest: Path, python_version: str | None, log_path: Path) -> None:
    environment = default_environment()
    target = ["--only-binary=:all:", "--dest", str(dest)]
    if python_version:
        target.append(f"--python-version={python_version}")
        environment.update(python_version=python_version, python_full_version=f"{python_version}.0")
    for step in steps:
        requirements = step.requirements
        if step.requirements_of:
            requirements = requirements_from_metadata(
                wheel_requires(dest, step.requirements_of), step.skip, environment
            )
        if requirements:
            pip(
                ["download", *target, *(["--no-deps"] if step.no_deps else []), *requirements],
                step.what,
                step.minutes,
                log_path,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("run", "test"))
    parser.add_argument("--torch", help="install (or download) this torch first, e.g. torch==2.13.0")
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    parser.add_argument("--list", action="store_true", help="print the steps; install nothing")
    parser.add_argument("--download", type=Path, metavar="DIR", help="download the wheels into DIR; install nothing")
    parser.add_argument("--python-version", help="with --download: the Python the wheels are for (X.Y)")
    parser.add_argument("--log", type=Path, help="pip's whole output (default: a file under the temporary folder)")
    args = parser.parse_args(argv)
    steps = plan(args.mode, load_pyproject(args.pyproject), args.torch)
    if args.list:
        for step in steps:
            flags = " --no-deps" if step.no_deps else ""
            body = step.requirements or [f"<{step.requirements_of}'s requirements less {', '.join(step.skip)}, torch>"]
            print(f"{step.what}:{flags} {' '.join(body)}")
        return 0
    log_path = args.log or Path(tempfile.gettempdir()) / f"inferd-pip-{os.getpid()}.log"
    if args.download:
        args.download.mkdir(parents=True, exist_ok=True)
        download(steps, args.download, args.python_version, log_path)
        return 0
    if not args.torch and not has_torch():
        raise SystemExit(
            f"{PREFIX} install torch first, pinned (--torch torch==X.Y.Z): a bare `torch` resolves to a CUDA build"
        )
    install(steps, log_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
