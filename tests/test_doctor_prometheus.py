"""`inferd doctor` against a real Prometheus holding a thrashing KV window, backfilled
with `promtool tsdb create-blocks-from openmetrics`: the KV checks fire on Prometheus's
own evaluation of their expressions, and no check's query is refused."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
import urllib.request

import pytest
from doctor_nodes import engine_server, gpu_replay, write_node
from test_agent import free_port, wait_for

from inferd.agent.doctor.inputs import DoctorOptions, gather
from inferd.agent.doctor.runner import run_checks

from fixture_trees import ENGINE_PID

WINDOW_S = 900
STEP_S = 15
STEPS_PER_S, RUNNING, BLOCK = 20.0, 160.0, 16
ALPHA, BETA = 0.05, 1 / 800


def length(t: float, start: float) -> float:
    """Mean context over the window: 200 to 3200 tokens."""
    return 200 + 3000 * min(max((t - start) / WINDOW_S, 0.0), 1.0)


def openmetrics(start: float) -> str:
    """15 s samples over the window; counters as running sums of their rates."""
    series: dict[str, list[tuple[float, float]]] = {
        name: []
        for name in (
            'inferd_kv_page_faults_total{kind="swap_in"}',
            "vllm:num_preemptions_total",
            "vllm:kv_cache_usage_perc",
            'inferd_kv_blocks{state="used"}',
            "inferd_scheduler_step_duration_seconds_count",
            "vllm:num_requests_running",
        )
    }
    faults = preemptions = steps = 0.0
    for i in range(WINDOW_S // STEP_S + 9):  # two minutes before the window, so rate() has points
        t = start - 120 + i * STEP_S
        used = length(t, start) * RUNNING / BLOCK
        fault_rate = ALPHA * (1 - math.exp(-BETA * length(t, start))) * STEPS_PER_S * used
        faults += fault_rate * STEP_S
        preemptions += 0.5 * STEP_S
        steps += STEPS_PER_S * STEP_S
        for name, value in (
            ('inferd_kv_page_faults_total{kind="swap_in"}', faults),
            ("vllm:num_preemptions_total", preemptions),
            ("vllm:kv_cache_usage_perc", 0.99),
            ('inferd_kv_blocks{state="used"}', used),
            ("inferd_scheduler_step_duration_seconds_count", steps),
            ("vllm:num_requests_running", RUNNING),
        ):
            series[name].append((t, value))
    lines = []
    for name, points in series.items():
        family = name.split("{")[0]
        lines.append(f"# TYPE {family} unknown")
        lines += [f"{name} {value} {t:.3f}" for t, value in points]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture
def prometheus(tmp_path):
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        pytest.skip("prometheus / promtool not installed (Debian packages prometheus)")
    now = time.time()
    start = now - WINDOW_S - 30
    data = tmp_path / "tsdb"
    source = tmp_path / "window.om"
    source.write_text(openmetrics(start))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        assert wait_for(ready, timeout=60), "prometheus did not become ready"
        yield url, now - 15  # the window ends just after the last sample
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_thrashing_window_in_a_real_prometheus(prometheus, tmp_path, monkeypatch):
    url, now = prometheus
    monkeypatch.setenv("INFERD_ADMIN_TOKEN", "doctor-test-token")
    roots = write_node(tmp_path / "host")
    with engine_server() as engine:
        options = DoctorOptions(
            engine_url=engine.url,
            prometheus_url=url,
            since_s=WINDOW_S,
            sysfs_root=str(roots.sysfs),
            procfs_root=str(roots.procfs),
            gpu_backend=f"replay:{gpu_replay(tmp_path / 'gpus.json')}",
            engine_pid=ENGINE_PID,
        )
        findings = {f.id: f for f in run_checks(gather(options, now=now))}
    refused = {
        fid: f.reason for fid, f in findings.items() if f.reason and ("refused" in f.reason or "Error" in f.reason)
    }
    assert refused == {}  # every check's PromQL parses and runs
    thrashing = findings["kv_cache.thrashing"]
    assert thrashing.status == "fail", thrashing.summary
    assert "0.50 preemptions/s" in thrashing.summary
    fit = findings["kv_cache.fault_fit"]
    assert fit.status == "ok", fit.reason
    values = {e.name: e.value for e in fit.evidence}
    # Each point averages two minutes (rate() and avg_over_time over 2m) in which the mean
    # length moves by 400 tokens, so the points blur the curve's knee a little.
    assert values["alpha"] == pytest.approx(ALPHA, rel=0.10)
    assert values["beta"] == pytest.approx(BETA, rel=0.15)
    assert values["r2"] > 0.95
