"""What the set-up installs: `make run` (and the agent image) get what inferd runs, `make test`
and `make lint` add the test extras; torch goes in first and pinned; xgrammar without triton
(scripts/install_deps.py, [tool.inferd.install.without] in pyproject.toml)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def load_install_deps():
    spec = importlib.util.spec_from_file_location("install_deps", ROOT / "scripts" / "install_deps.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("install_deps", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def names(requirements: list[str]) -> set[str]:
    module = load_install_deps()
    return {module.req_name(r) for r in requirements}


def test_the_run_set_holds_no_test_only_package():
    install_deps = load_install_deps()
    steps = install_deps.plan("run", PYPROJECT, "torch==2.13.0")
    run = set().union(*(names(s.requirements) for s in steps))
    test_only = names(PYPROJECT["project"]["optional-dependencies"]["test"]) - names(
        PYPROJECT["project"]["dependencies"]
    )
    assert {"pytest", "ruff", "mypy", "schemathesis", "lm-eval", "triton", "hypothesis"} <= test_only
    assert not run & test_only, f"make run would install test-only packages: {sorted(run & test_only)}"
    # every runtime dependency is installed by some step, xgrammar with --no-deps and then its
    # own requirements less triton
    assert names(PYPROJECT["project"]["dependencies"]) <= run
    (xgrammar,) = [s for s in steps if s.requirements_of == "xgrammar"]
    assert xgrammar.skip == ("triton",)
    assert [s.no_deps for s in steps if "xgrammar" in names(s.requirements)] == [True]


def test_torch_goes_in_first_and_pinned_and_nowhere_else():
    install_deps = load_install_deps()
    steps = install_deps.plan("run", PYPROJECT, "torch==2.13.0")
    assert steps[0].requirements == ["torch==2.13.0"]
    for step in steps[1:]:
        assert "torch" not in names(step.requirements), step
    # a step that reads a package's requirements drops torch and the skipped ones, extras and
    # markers that do not apply
    requires = [
        "apache-tvm-ffi>=0.1.11",
        "pydantic",
        "torch>=1.10.0",
        "transformers>=4.38.0",
        'triton; platform_system == "Linux" and platform_machine == "x86_64"',
        'pytest; extra == "test"',
        'mlx-lm; platform_system == "Darwin" and extra == "metal"',
        'old-thing; python_version < "3.8"',
    ]
    env = {"platform_system": "Linux", "platform_machine": "x86_64", "python_version": "3.11"}
    got = install_deps.requirements_from_metadata(requires, ("triton",), env)
    assert got == ["apache-tvm-ffi>=0.1.11", "pydantic", "transformers>=4.38.0"]
    # setup.sh pins torch exactly; the script refuses to run without torch or a pin
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pin = re.search(r"^TORCH=torch==(\S+)$", setup, flags=re.M)
    assert pin and re.fullmatch(r"\d+\.\d+\.\d+", pin.group(1))
    assert 'install_deps.py run --torch "$TORCH"' in setup
    assert "-e '.[test]'" not in setup and "--no-deps -e ." in setup


def test_the_test_set_is_the_test_extras():
    install_deps = load_install_deps()
    (step,) = install_deps.plan("test", PYPROJECT)
    assert step.requirements == PYPROJECT["project"]["optional-dependencies"]["test"]
    assert {"ruff", "mypy", "import-linter"} <= names(step.requirements)  # make lint's tools


def make_dry(target: str) -> str:
    result = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("target, with_tests", [("run", False), ("serve", False), ("test", True), ("lint", True)])
def test_make_targets_set_up_what_they_need(target, with_tests):
    lines = [line.strip() for line in make_dry(target).splitlines()]
    setup = [line for line in lines if line.startswith("scripts/setup.sh")]
    assert setup == (["scripts/setup.sh --test"] if with_tests else ["scripts/setup.sh"]), lines


def test_list_prints_the_steps():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "install_deps.py"), "run", "--list", "--torch", "torch==2.13.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": torch==2.13.0")
    assert any("--no-deps xgrammar" in line for line in lines)
    assert not any(
        re.search(r"\b(pytest|triton|lm-eval)\b", line.split(":", 1)[1]) for line in lines if "less" not in line
    )
