"""The layers hold: import-linter's contracts in .importlinter (the engine stands alone, the
exporters sit below the agent, the dashboards import none of them, no cycles in the engine),
and every import goes through the one `inferd` namespace."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "agent", "exporters", "dashboards", "ebpf")


def lint_imports() -> str:
    found = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(found).exists():
        pytest.skip("import-linter not installed (pip install import-linter; the test extra has it)")
    return found


def test_import_contracts_are_kept():
    result = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def contracts_over_copy(tmp_path: Path, module: str, source: str) -> subprocess.CompletedProcess:
    """lint-imports over a copy of the packages with `module` (a path under inferd/) added."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / "inferd" / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "inferd" / "__init__.py", tmp_path / "inferd" / "__init__.py")
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    (tmp_path / "inferd" / module).write_text(source)
    return subprocess.run(
        [lint_imports(), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )


def test_a_forbidden_import_breaks_a_contract(tmp_path):
    """The check can fail: the same contracts over a copy where the engine imports the agent."""
    result = contracts_over_copy(tmp_path, "engine/leak.py", "from inferd.agent import supervisor  # noqa: F401\n")
    assert result.returncode != 0
    assert "The engine never imports the agent" in result.stdout and "BROKEN" in result.stdout


def test_an_upward_import_in_the_engine_breaks_its_layers(tmp_path):
    """The KV cache importing the runner (a folder above it) is refused twice: as a cycle
    between the engine's folders and as an import against the layers' direction."""
    result = contracts_over_copy(tmp_path, "engine/kv/leak.py", "from ..runner import model_runner  # noqa: F401\n")
    assert result.returncode != 0
    assert "inferd.engine.kv is not allowed to import inferd.engine.runner" in result.stdout
    assert "- .kv -> .runner" in result.stdout


def top_level_imports(source: str) -> list[str]:
    """The imports in `source` that name one of the design's folders as a top-level package
    (`import engine.x`, `from agent import y`) instead of through inferd; relative imports are fine."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in PACKAGES]
    return found


def test_top_level_import_is_found():
    assert top_level_imports("import engine.config\nfrom agent import cli\nfrom .x import y\n") == [
        "engine.config",
        "agent",
    ]
    assert top_level_imports("import inferd.engine.config\nfrom inferd.agent import cli\n") == []


def test_everything_imports_through_the_inferd_namespace():
    """A module imported both as engine.x and inferd.engine.x would exist twice (two registries,
    failing isinstance checks), and the wheel installs only inferd."""
    files = [
        path
        for folder in (*PACKAGES, "inferd", "tests", "scripts")
        if (ROOT / folder).is_dir() and not (ROOT / folder).is_symlink()
        for path in (ROOT / folder).rglob("*.py")
    ]
    assert len(files) > 100
    offenders = {str(path.relative_to(ROOT)): top_level_imports(path.read_text()) for path in files}
    assert {path: names for path, names in offenders.items() if names} == {}
