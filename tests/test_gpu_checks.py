"""The on-GPU checks of scripts/gpu_fastpath_check.py as tests (marker `gpu`): the Triton
decode kernel against a float64 reference, the fused ops against their torch references,
and each model section on the llama3-8b-shape preset in bf16 (fast engine, fallback engine
and transformers on one set of weights). Every check a group records must pass.

Each group runs the script's own functions in a child process, with TRITON_INTERPRET
unset: the CPU kernel tests turn the Triton interpreter on for this process when they are
collected. Skipped, with what is missing, without a CUDA GPU or triton. The script's
`--dry-run` (the model sections on the CPU, tiny preset, kernels in the interpreter) takes
about seven minutes on two cores and is not run here.

    pytest -m gpu tests/test_gpu_checks.py
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferd.engine.fast_path import has_triton

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_fastpath_check.py"


def _missing() -> str | None:
    if not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no device visible"
        return f"needs a CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__}, {build})"
    if not has_triton():
        return "needs triton (pip) for the fast path's kernels"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def _model_sections() -> list[str]:
    """The names in the script's MODEL_SECTIONS list, read without importing it."""
    for node in ast.parse(SCRIPT.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MODEL_SECTIONS" for t in node.targets):
            return [elt.id for elt in node.value.elts]
    raise AssertionError(f"{SCRIPT} has no MODEL_SECTIONS list")


# Imports the script, wraps each model section to note which checks it records, runs the
# named functions, writes {"checks": ..., "sections": {section: [check names]}}.
DRIVER = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("gpu_fastpath_check", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
sections = {}

def noting(section):
    def run(**ctx):
        before = set(script.results["checks"])
        try:
            section(**ctx)
        finally:
            sections[section.__name__] = sorted(set(script.results["checks"]) - before)
    run.__name__ = section.__name__
    return run

if len(sys.argv) > 4:  # a shape and the sections to run on it
    script.SHAPE = sys.argv[4]
    script.MODEL_SECTIONS = [s for s in script.MODEL_SECTIONS if s.__name__ in sys.argv[5].split(",")]
script.MODEL_SECTIONS = [noting(s) for s in script.MODEL_SECTIONS]
for name in sys.argv[3].split(","):
    getattr(script, name)()
with open(sys.argv[2], "w") as f:
    json.dump({"checks": script.results["checks"], "sections": sections}, f, default=str)
"""


def run_checks(steps: str, out: Path, *shape_and_sections: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(SCRIPT), str(out), steps, *shape_and_sections],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    return json.loads(out.read_text())


def failed(checks: dict) -> dict:
    return {name: detail for name, detail in checks.items() if not detail["ok"]}


def test_decode_kernel_matches_a_float64_reference(tmp_path):
    """Contexts 1 to 32768 across block and split boundaries, a padded row, a sliding window."""
    checks = run_checks("check_attention_kernel", tmp_path / "out.json")["checks"]
    assert checks and not failed(checks), failed(checks)


def test_attention_kernels_take_every_shape_users_load(tmp_path):
    """No GQA, GQA 3/5/6/7, head dims 64/80/96/128, odd row counts and partial packs."""
    checks = run_checks("check_attention_shapes", tmp_path / "out.json")["checks"]
    assert len(checks) == 6 and not failed(checks), failed(checks)


def test_fused_ops_match_their_torch_references(tmp_path):
    checks = run_checks("check_fused_ops", tmp_path / "out.json")["checks"]
    assert {"fused_add_rms_norm", "fused_silu_and_mul", "fused_rope_and_cache"} <= set(checks)
    assert not failed(checks), failed(checks)


@pytest.fixture(scope="module")
def model_checks(tmp_path_factory) -> dict:
    """check_model once: builds the model and both engines, then runs every section."""
    return run_checks("check_model", tmp_path_factory.mktemp("gpu-checks") / "out.json")


def test_the_fast_path_attaches(model_checks):
    assert model_checks["checks"]["fast_path_attached"]["ok"], model_checks["checks"]["fast_path_attached"]


@pytest.mark.parametrize("section", _model_sections())
def test_model_section(model_checks, section):
    checks = model_checks["checks"]
    ran = checks.get(f"{section}_ran")
    assert ran is None, f"{section} raised: {ran}"
    assert section in model_checks["sections"], f"{section} did not run"
    mine = {name: checks[name] for name in model_checks["sections"][section]}
    assert not failed(mine), failed(mine)


def _other_shapes() -> list[str]:
    """The script's SHAPES besides the 8B one, read without importing it."""
    for node in ast.parse(SCRIPT.read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "SHAPES":
            return [key.value for key in node.value.keys if key.value != "llama3-8b-shape"]
    raise AssertionError(f"{SCRIPT} has no SHAPES dict")


@pytest.mark.parametrize("shape", _other_shapes())
def test_the_fast_path_on_other_model_shapes(tmp_path, shape):
    """head_dim 64, 80 and 96, GQA 3, 6 and 7, q/k/v bias, tied embeddings, no GQA (small and
    8B-class): the fast path attaches, its greedy tokens and logits hold against the portable
    path and transformers, and eight mixed-length prompts after a cached prefix never leave it."""
    sections = ("check_greedy", "check_contexts", "check_mixed_prompts_after_prefix")
    result = run_checks("check_model", tmp_path / "out.json", shape, ",".join(sections))
    checks = result["checks"]
    assert checks["fast_path_attached"]["ok"], checks["fast_path_attached"]
    assert set(sections) <= set(result["sections"])
    assert not failed(checks), failed(checks)
