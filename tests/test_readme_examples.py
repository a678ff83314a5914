"""The README's curl examples, run as written against `inferd serve` on a free port (the
port and the admin token's path substituted): each must answer 2xx with JSON. Parsed
from README.md, so an example that stops working fails here."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from server_fixtures import free_port, serve, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
README_TOKEN_PATH = ".out/stack/admin-token"  # where `inferd stack up` writes it (agent.stack)


def readme_curls(text: str) -> list[str]:
    """Every command line of a ```sh block that starts with curl (backslash continuations joined)."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("curl "):
                commands.append(line)
    return commands


def test_the_parser_finds_curl_lines_in_sh_blocks_only():
    text = "```sh\nmake run\ncurl -s a \\\n  -d b\n```\n```json\ncurl -s nope\n```\n"
    assert readme_curls(text) == ["curl -s a    -d b"]


CURLS = readme_curls((ROOT / "README.md").read_text())


def test_the_readme_has_the_examples_a_user_needs():
    assert any("/v1/completions" in c for c in CURLS)
    assert any("/admin/config" in c and README_TOKEN_PATH in c for c in CURLS)
    from inferd.agent.stack import ADMIN_TOKEN_FILE, DEFAULT_RUN_DIR

    assert DEFAULT_RUN_DIR / ADMIN_TOKEN_FILE == ROOT / README_TOKEN_PATH


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if shutil.which("curl") is None:
        pytest.skip("curl not installed")
    tmp = tmp_path_factory.mktemp("readme")
    model = tmp / "tiny"
    made = subprocess.run(
        [sys.executable, "-m", "inferd.agent.cli", "make-model", str(model), "--preset", "tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    token = tmp / "admin-token"
    token.write_text("readme-example-token\n")
    port = free_port()
    proc = serve(
        ["--model", str(model), "--port", str(port), "--served-model-name", "tiny", "--admin-token-file", str(token)],
        env={"INFERD_PROGRESS": "0"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        yield port, token, tmp
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.parametrize("command", CURLS)
def test_readme_curl_example_answers_2xx_with_json(server, command):
    port, token, tmp = server
    line = command.replace("localhost:8000", f"127.0.0.1:{port}").replace(README_TOKEN_PATH, shlex.quote(str(token)))
    assert f"127.0.0.1:{port}" in line, f"the example does not call the engine on localhost:8000: {command}"
    body = tmp / "body.json"
    result = subprocess.run(
        ["bash", "-c", f"{line} -o {shlex.quote(str(body))} -w '%{{http_code}}'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status = int(result.stdout.strip())
    assert 200 <= status < 300, f"{command}\n-> {status}: {body.read_text()}"
    json.loads(body.read_text())
