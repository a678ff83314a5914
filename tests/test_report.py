"""`inferd report` against a stand-in Prometheus HTTP API that records the queries it gets.

The report against a real Prometheus runs in tests/test_stack.py (live, slow).
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib not installed")

from inferd.agent import report
from inferd.dashboards.boards import BOARDS


class FakePrometheus(BaseHTTPRequestHandler):
    queries: list[dict] = []

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        type(self).queries.append(params)
        start, step = float(params["start"]), float(params["step"])
        result = []
        if "vllm:num_requests_running" in params["query"]:
            values = [[start + i * step, str(i % 4)] for i in range(20)]
            result = [{"metric": {"host": "n1"}, "values": values}]
        if "bad_query" in params["query"]:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"status":"error","error":"parse error"}')
            return
        body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus():
    FakePrometheus.queries = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_report_plots_headline_panels_and_marks_empty_ones(prometheus, tmp_path):
    config = report.ReportConfig(prometheus, minutes=10, out_dir=tmp_path, step_s=5)
    index = report.write_report(config, BOARDS, now=1_800_000_000.0)
    page = index.read_text()
    headline = [p for b in BOARDS for p in b.panels if p.headline]
    assert len(FakePrometheus.queries) == sum(len(p.queries) for p in headline)
    for q in FakePrometheus.queries:
        assert "$" not in q["query"], q["query"]
        assert float(q["end"]) - float(q["start"]) == 600 and q["step"] == "5"
    for panel in headline:
        assert panel.title in page
    pngs = sorted(tmp_path.glob("*.png"))
    assert [p.name for p in pngs] == ["inferd-engine-requests-running-and-waiting.png"]
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "inferd-engine-requests-running-and-waiting.png" in page
    assert page.count("No data in this window.") == len(headline) - 1
    # the last value of the one series served (running; waiting got none): 19 % 4 = 3
    assert page.count("<td>running</td><td>3</td>") == 1


def test_report_command_reports_bad_queries_and_bad_arguments(prometheus, tmp_path, capsys, monkeypatch):
    args = argparse.Namespace(prometheus=prometheus, minutes=5, step=5, out=tmp_path)
    from inferd.dashboards import spec

    broken = spec.Board(
        uid="broken-board",
        title="b",
        description="d",
        variables=(),
        rows=(spec.Row("r", (spec.Panel("p", "d", "s", (spec.Query("bad_query"),), headline=True),)),),
    )
    monkeypatch.setattr("inferd.dashboards.boards.BOARDS", (broken,))
    assert report.run(args) == 1
    assert "parse error" in capsys.readouterr().err
    args.minutes = 0
    assert report.run(args) == 1
    assert "--minutes" in capsys.readouterr().err
    args.minutes, args.prometheus = 5, "http://127.0.0.1:9"
    assert report.run(args) == 1
    assert "cannot reach Prometheus" in capsys.readouterr().err


def test_report_cli_is_registered():
    from inferd.agent.cli import COMMANDS

    assert COMMANDS["report"][0] == "inferd.agent.report"
    assert COMMANDS["stack"][0] == "inferd.agent.stack"
    assert Path(report.__file__).name == "report.py"


def test_report_prints_the_absolute_path_of_the_page(prometheus, tmp_path, capsys, monkeypatch):
    from inferd.agent.cli import command_parser

    monkeypatch.chdir(tmp_path)  # outside the checkout: ./inferd-report
    args = command_parser("report").parse_args(["--prometheus", prometheus, "--minutes", "5", "--step", "5"])
    assert args.out is None
    assert report.run(args) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.is_absolute() and printed == tmp_path / "inferd-report" / "index.html"
    assert printed.is_file()
    elsewhere = command_parser("report").parse_args(["--prometheus", prometheus, "--output", "sub/dir"])
    assert report.run(elsewhere) == 0
    assert Path(capsys.readouterr().out.strip()) == tmp_path / "sub" / "dir" / "index.html"


def test_the_default_output_inside_the_checkout_is_ignored_by_git(monkeypatch):
    import shutil
    import subprocess

    repo = Path(report.__file__).resolve().parents[1]
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout (or no git): nothing for the report to dirty")
    monkeypatch.chdir(repo / "docs")  # anywhere inside the checkout
    out = report.default_output()
    assert out == repo / ".out" / "report"
    # a page written there, or in ./inferd-report as older versions did, leaves `git status` clean
    for page in (out / "index.html", repo / "inferd-report" / "index.html"):
        ignored = subprocess.run(["git", "check-ignore", "-q", str(page)], cwd=repo)
        assert ignored.returncode == 0, f"{page} is not ignored by git"
