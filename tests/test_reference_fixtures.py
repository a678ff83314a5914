"""The other projects' files the tests compare inferd against live in the repository
(tests/fixtures/reference), with their licence, notices and sources, so that every clone
runs those tests: no test reads a folder outside the checkout."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REFERENCE = TESTS / "fixtures" / "reference"
# what a path outside the checkout to the old shared reference folder looked like
OUTSIDE = re.compile(r"""/work/shared|["']shared["']\s*/\s*["']reference["']|parents\[2\]""")


def test_no_test_reads_reference_data_outside_the_checkout():
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(TESTS.glob("*.py"))
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offenders == []


def test_every_vendored_file_has_its_source_version_and_licence():
    readme = (REFERENCE / "README.md").read_text()
    assert "Apache License" in (REFERENCE / "LICENSE-Apache-2.0.txt").read_text()
    assert "CoreOS" in (REFERENCE / "NOTICE").read_text()  # prometheus-operator's NOTICE, carried
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    files = sorted(p.relative_to(REFERENCE) for p in REFERENCE.rglob("*") if p.is_file() and p.parent != REFERENCE)
    assert files
    for path in files:
        row = next((r for r in rows if _names(r, path)), None)
        assert row is not None, f"{path} is not listed in {REFERENCE / 'README.md'}"
        assert re.search(r"NVIDIA/dcgm-exporter|vllm-project/vllm|prometheus-operator/prometheus-operator", row), path
        assert re.search(r"\b[0-9a-f]{40}\b|\bv\d+\.\d+\.\d+\b|no commit was recorded", row), f"{path}: no version"


def _names(row: str, path: Path) -> bool:
    """The README row's first cell names the file (`a/{b,c}.yaml` names a/b.yaml and a/c.yaml)."""
    cell = row.split("|")[1].strip().strip("`")
    match = re.fullmatch(r"(.*)\{(.*)\}(.*)", cell)
    names = [match.group(1) + part + match.group(3) for part in match.group(2).split(",")] if match else [cell]
    return str(path) in names
