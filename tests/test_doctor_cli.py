"""`inferd doctor` as users run it: exit status 0 / 1 / 2, JSON that validates against its
published schema, a table with colour only on a TTY, bad options refused with a message;
and the headroom collector the agent exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from doctor_nodes import FakeHttp, config_space, gpu_replay, healthy_description, set_files, write_node

from inferd.agent.cli import main
from inferd.agent.collectors.headroom import HeadroomCollector
from inferd.agent.doctor.findings import Evidence, Finding
from inferd.agent.doctor.inputs import DoctorOptions, Inputs
from inferd.agent.doctor.render import to_dict, to_text
from inferd.agent.doctor.runner import Diagnosis
from inferd.agent.doctor.schema import SCHEMA
from inferd.exporters.engine_metrics import EngineMetricsConfig, EngineMetricsReader

from fixture_trees import ENGINE_PID

REPO = Path(__file__).resolve().parents[1]


def doctor(roots, replay, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "inferd.agent.cli",
            "doctor",
            "--sysfs-root",
            str(roots.sysfs),
            "--procfs-root",
            str(roots.procfs),
            "--gpu-backend",
            f"replay:{replay}",
            "--engine-pid",
            str(ENGINE_PID),
            "--no-discover",  # this node's own stack, if one runs, stays out of it
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_exit_status_is_0_ok_1_warning_2_failure_and_the_json_validates(tmp_path):
    replay = gpu_replay(tmp_path / "gpus.json")
    healthy = doctor(write_node(tmp_path / "ok"), replay, "--json")
    assert healthy.returncode == 0, healthy.stderr
    report = json.loads(healthy.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["exit_status"] == 0 and report["counts"]["warn"] == report["counts"]["fail"] == 0

    warned = doctor(write_node(tmp_path / "warn", configs={"0000:06:00.0": config_space(mps=128)}), replay, "--json")
    assert warned.returncode == 1, warned.stderr
    report = json.loads(warned.stdout)
    jsonschema.validate(report, SCHEMA)
    assert [f["id"] for f in report["findings"] if f["status"] == "warn"] == ["pcie.payload"]
    assert report["findings"][0]["id"] == "pcie.payload"  # ranked first

    failed = doctor(
        write_node(tmp_path / "fail", set_files(healthy_description(), "0000:81:00.0", current_link_width="8")), replay
    )
    assert failed.returncode == 2, failed.stderr
    assert failed.stdout.startswith("STATUS")
    assert "FAIL    pcie.link" in failed.stdout and "\033[" not in failed.stdout  # not a TTY: no colour
    assert "fix: reseat the GPU" in failed.stdout


def test_published_schema_is_a_valid_schema_and_rejects_a_bad_report(capsys):
    assert main(["doctor", "--schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == SCHEMA
    # the published copy beside the manual: `inferd doctor --schema > docs/doctor.schema.json` after a change
    assert json.loads((REPO / "docs" / "doctor.schema.json").read_text()) == SCHEMA
    jsonschema.Draft202012Validator.check_schema(schema)
    finding = Finding("pcie.link", "pcie", "pcie", "warn", "t", "s", 0.1, (Evidence("x", 1, "sysfs:x"),), fix="f")
    report = to_dict(Diagnosis((finding,), Inputs(DoctorOptions(), now=1.0)))
    jsonschema.validate(report, SCHEMA)
    report["findings"][0]["status"] = "bad"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, SCHEMA)
    report["findings"][0].update(status="warn", fix=None)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, SCHEMA)


def test_bad_options_are_refused_with_a_message(capsys):
    for args, message in (
        (["--since", "15 minutes"], "bad duration '15 minutes'"),
        (["--only", "pcei"], "unknown check(s) pcei"),
        (["--agent", "localhost:10400"], "--agent must be an http(s) URL"),
    ):
        assert main(["doctor", *args]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and captured.out == ""


def test_findings_refuse_what_the_schema_forbids():
    with pytest.raises(ValueError, match="needs its fix"):
        Finding("pcie.link", "pcie", "pcie", "fail", "t", "s")
    with pytest.raises(ValueError, match="needs its reason"):
        Finding("pcie.link", "pcie", "pcie", "skip", "t", "s")
    with pytest.raises(ValueError, match="must start with its check"):
        Finding("link", "pcie", "pcie", "ok", "t", "s")


def test_colour_only_when_asked():
    finding = Finding("pcie.link", "pcie", "pcie", "fail", "t", "s", 0.5, fix="f")
    diagnosis = Diagnosis((finding,), Inputs(DoctorOptions(), now=1.0))
    assert "\033[31m" in to_text(diagnosis, colour=True)
    assert "\033[" not in to_text(diagnosis, colour=False)
    assert to_text(diagnosis).rstrip().endswith("1 fail, 0 warn, 0 skip, 0 ok; exit status 2")


def engine_scrape(step_sum: float, steps: int, batch_sum: float, finished: int) -> str:
    return f"""# TYPE inferd_scheduler_step_duration_seconds histogram
inferd_scheduler_step_duration_seconds_bucket{{le="+Inf"}} {steps}
inferd_scheduler_step_duration_seconds_count {steps}
inferd_scheduler_step_duration_seconds_sum {step_sum}
# TYPE inferd_scheduler_batch_size histogram
inferd_scheduler_batch_size_bucket{{le="+Inf"}} {steps}
inferd_scheduler_batch_size_count {steps}
inferd_scheduler_batch_size_sum {batch_sum}
# TYPE vllm:request_success_total counter
vllm:request_success_total{{finished_reason="length"}} {finished}
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{{le="+Inf"}} {max(finished, 1)}
vllm:request_generation_tokens_count {max(finished, 1)}
vllm:request_generation_tokens_sum {100 * max(finished, 1)}
# TYPE inferd_engine_tunable gauge
inferd_engine_tunable{{param="max_num_seqs"}} 256.0
"""


def test_headroom_collector_exports_capacity_once_batch_sizes_vary():
    from fixture_trees import samples, scrape

    engine = FakeHttp()
    with engine:
        reader = EngineMetricsReader(
            EngineMetricsConfig(
                url=f"{engine.url}/metrics",
                families=__import__("inferd.agent.collectors.headroom", fromlist=["FAMILIES"]).FAMILIES,
            )
        )
        collector = HeadroomCollector(reader, slo_step_s=0.05)
        step_sum = batch_sum = 0.0
        steps = 0
        outputs = []
        # each scrape: 100 steps at one batch size, t(b) = 10 ms + 0.5 ms x b
        for batch in (None, 4, 8, 16, 32):
            if batch is not None:
                steps += 100
                step_sum += 100 * (0.010 + 0.0005 * batch)
                batch_sum += 100 * batch
            engine.routes["/metrics"] = (200, "text/plain", engine_scrape(step_sum, steps, batch_sum, 0))
            outputs.append(scrape(collector))
    first, last = outputs[0], outputs[-1]
    assert samples(first, "inferd_headroom_requests_per_second") == {}
    assert "# TYPE inferd_headroom_requests_per_second gauge" in first
    assert samples(last, "inferd_headroom_capacity_requests_per_second")[()] == pytest.approx(16.0)
    assert samples(last, "inferd_collector_up") == {(("collector", "headroom"),): 1.0}


def test_headroom_collector_reports_an_unreachable_engine_as_down():
    from fixture_trees import samples, scrape

    reader = EngineMetricsReader(EngineMetricsConfig(url="http://127.0.0.1:9/metrics", timeout_s=0.5))
    text = scrape(HeadroomCollector(reader, slo_step_s=0.05))
    assert samples(text, "inferd_collector_up") == {(("collector", "headroom"),): 0.0}


def test_report_opens_with_the_diagnosis_section(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed")
    from inferd.agent import report
    from inferd.agent.cli import command_parser

    def page(*extra: str) -> str:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        args = command_parser("report").parse_args(
            ["--prometheus", prometheus.url, "--minutes", "5", "--output", str(out), *extra]
        )
        assert report.run(args) == 0
        return (out / "index.html").read_text()

    with FakeHttp() as prometheus:
        full = page()
        queried = list(prometheus.queries)
        bare = page("--no-diagnosis")
    assert "<h2>Diagnosis</h2>" in full and "<h2>Diagnosis</h2>" not in bare
    assert full.index("<h2>Diagnosis</h2>") < full.index("<h2>", full.index("<h2>Diagnosis</h2>") + 1)
    assert "kv_cache.fault_fit" in full and "saturation.knee" in full
    assert any("inferd_kv_page_faults_total" in q for q in queried)  # the doctor asked the report's Prometheus


def test_the_manual_names_every_threshold_and_check():
    from dataclasses import fields

    from inferd.agent.doctor.check import load_checks
    from inferd.agent.doctor.thresholds import Thresholds

    manual = (REPO / "docs" / "DOCTOR.md").read_text()
    missing = [f.name for f in fields(Thresholds) if f"`{f.name}`" not in manual]
    missing += [c.id for c in load_checks() if f"| `{c.id}` |" not in manual]
    assert missing == []
