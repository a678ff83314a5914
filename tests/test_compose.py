"""The stack: its static configuration (compose.yaml, Dockerfile, Prometheus, Alertmanager,
OpenTelemetry Collector and Grafana provisioning, checked with the distributions' tools),
and, in the slow test at the end, compose.yaml brought up for real under podman."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed (Debian package; scripts/setup.sh installs it)")
    return path


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_docker_compose_config_accepts_compose_yaml():
    binary = need("docker-compose")
    for profile in ("cpu", "gpu"):
        result = run(binary, "-f", str(COMPOSE), "config", env={**os.environ, "COMPOSE_PROFILES": profile})
        assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)
    assert {"agent", "agent-cpu", "prometheus", "alertmanager", "grafana", "otel-collector"} <= set(
        rendered["services"]
    )


def test_every_file_compose_mounts_exists_in_the_repository():
    checked = 0
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
                checked += 1
            else:
                # named volumes and the host paths eBPF needs are not repository files
                assert source in compose()["volumes"] or source.startswith("/"), f"{name}: unknown volume {source}"
    assert checked >= 6


def test_agent_has_gpu_ebpf_and_host_pid():
    services = compose()["services"]
    gpu, cpu = services["agent"], services["agent-cpu"]
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert "deploy" not in cpu, "the CPU profile must run on hosts without a GPU runtime"
    assert gpu["build"] == {"context": ".", "target": "gpu"} and cpu["build"] == {"context": ".", "target": "cpu"}
    assert gpu["image"] != cpu["image"], "the two variants are two images"
    for service in (gpu, cpu):
        assert service["pid"] == "host"
        assert {"BPF", "PERFMON", "SYS_ADMIN"} <= set(service["cap_add"])
        targets = {v.split(":")[1] for v in service["volumes"]}
        assert {"/sys/kernel/debug", "/lib/modules", "/usr/src"} <= targets
    assert (ROOT / ".env").read_text().count("COMPOSE_PROFILES=cpu") == 1


def test_grafana_is_provisioned_with_anonymous_viewer():
    grafana = compose()["services"]["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["./dashboards/provisioning"] == env["GF_PATHS_PROVISIONING"]
    assert mounts["./dashboards/generated"] == env["INFERD_DASHBOARDS_DIR"]
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards/generated" / Path(home).name).is_file()


def test_prometheus_and_alertmanager_use_the_repository_files():
    services = compose()["services"]
    prom = services["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prom["volumes"])
    config = next(a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file="))
    assert config == mounts["./prometheus"] + "/prometheus.yml"
    # rule_files are relative to the config file; the mounts must keep that layout
    rules = yaml.safe_load((ROOT / "prometheus/prometheus.yml").read_text())["rule_files"]
    for rule in rules:
        assert (ROOT / "prometheus" / rule).resolve().is_file(), rule
        assert os.path.normpath(Path(config).parent / rule).startswith(mounts["./alerts"])
    am = services["alertmanager"]
    am_config = next(a.split("=", 1)[1] for a in am["command"] if a.startswith("--config.file="))
    am_mounts = dict(v.split(":")[:2] for v in am["volumes"])
    assert am_config == am_mounts["./alerts"] + "/alertmanager.yml"
    token_files = re.findall(r"credentials_file:\s*(\S+)", (ROOT / "alerts/alertmanager.yml").read_text())
    for token in token_files:
        assert any(token.startswith(target + "/") for target in am_mounts.values()), f"{token} not mounted"


def test_promtool_check_config():
    result = run(need("promtool"), "check", "config", str(ROOT / "prometheus/prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rules found" in result.stdout


def test_prometheus_scrapes_agent_and_engine_with_a_host_label():
    config = yaml.safe_load((ROOT / "prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["inferd-agent"]["static_configs"][0]["targets"] == ["localhost:10400"]
    assert jobs["inferd-engine"]["static_configs"][0]["targets"] == ["localhost:8000"]
    for name in ("inferd-agent", "inferd-engine"):
        assert any(r["target_label"] == "host" for r in jobs[name]["relabel_configs"])
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["localhost:9093"]


def test_amtool_check_config():
    result = run(need("amtool"), "check-config", str(ROOT / "alerts/alertmanager.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_otel_collector_pipelines_use_defined_components():
    config = yaml.safe_load((ROOT / "otel/collector.yaml").read_text())
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert config["exporters"]["prometheus"]["endpoint"].endswith(":8889")
    for name, pipeline in config["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"pipeline {name}: {kind[:-1]} {component} is not defined"
    assert "prometheus" in config["service"]["pipelines"]["metrics"]["exporters"]


def test_grafana_provisioning_matches_the_boards():
    datasources = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/inferd.yaml").read_text())
    by_type = {d["type"]: d for d in datasources["datasources"]}
    assert by_type["prometheus"]["url"] == "http://localhost:9090"
    assert by_type["alertmanager"]["url"] == "http://localhost:9093"
    board = json.loads((ROOT / "dashboards/generated/inferd-engine.json").read_text())
    assert board["panels"][1]["datasource"]["uid"] == by_type["prometheus"]["uid"]
    providers = yaml.safe_load((ROOT / "dashboards/provisioning/dashboards/inferd.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "${INFERD_DASHBOARDS_DIR}"


def dockerfile_stages(text: str) -> dict[str, str]:
    """Each stage's name and its text."""
    parts = re.split(r"^FROM\s+", text, flags=re.M)[1:]
    return {part.split()[2] if " AS " in part.split("\n")[0] else part.split()[0]: part for part in parts}


def test_dockerfile_installs_the_runtime_only_from_an_official_base():
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, flags=re.M).group(1)
    # Docker Official Images have no namespace (python:3.11-slim, debian:bookworm)
    assert base == "python:3.11-slim"
    stages = dockerfile_stages(text)
    assert {"runtime", "build", "project", "build-cpu", "cpu", "build-gpu", "gpu"} <= set(stages)
    assert stages["runtime"].startswith("${BASE_IMAGE}")
    assert list(stages)[-1] == "cpu", "the default target is the CPU variant"
    # the developer set-up, test extras and editable installs stay out of the image
    instructions = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for word in ("scripts/setup.sh", "[test]", "pip install -e", "--editable", "prometheus", "docker-compose"):
        assert word not in instructions, f"Dockerfile runs {word}"
    assert "download.pytorch.org/whl/cpu" in stages["build-cpu"]
    # both variants install what `make run` installs, the same way (xgrammar without triton),
    # after their own torch
    for variant in ("cpu", "gpu"):
        stage = stages[f"build-{variant}"]
        assert "python /wheels/install_deps.py run --pyproject /wheels/pyproject.toml" in stage
        assert stage.index('"torch==${TORCH_VERSION}"') < stage.index("install_deps.py run")
    assert "--index-url" not in stages["build-gpu"], "the GPU variant takes PyPI's (CUDA) torch"
    for variant in ("cpu", "gpu"):
        assert f"COPY --from=build-{variant} /opt/inferd /opt/inferd" in stages[variant]
    # the image builds the wheel from the inferd package the checkout links together: every
    # folder inferd/ links to, and the namespace's own modules (inferd/*.py)
    tomllib = pytest.importorskip("tomllib")
    copied = set(re.findall(r"^COPY (\w+) /src/inferd/\1$", stages["project"], flags=re.M))
    linked = {path.name for path in (ROOT / "inferd").iterdir() if path.is_symlink()}
    assert copied == linked and "engine" in linked
    assert "COPY inferd/*.py /src/inferd/" in stages["project"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["inferd", "inferd.*"]
    # the context is what the Dockerfile copies, and the wheels folder for offline builds
    lines = [
        s
        for s in (line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines())
        if s and not s.startswith("#")
    ]
    assert lines[0] == "*", "everything is left out unless named"
    assert {"!pyproject.toml", "!scripts/install_deps.py", "!.whl", "!inferd/*.py", *(f"!{p}" for p in linked)} <= set(
        lines
    )
    assert not {"!.git", "!.venv", "!.out", "!tests"} & set(lines)


def test_podman_image_hash_covers_what_the_dockerfile_copies():
    """scripts/compose_podman.py reuses an image whose input hash matches: the hash must read
    every folder the Dockerfile copies, or a changed file could run in a stale image."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compose_podman", ROOT / "scripts" / "compose_podman.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "Dockerfile").read_text()
    copied = re.findall(r"^COPY (\w+) /src/inferd/\1$", text, flags=re.M)
    assert set(copied) == set(module.CONTEXT_DIRS)
    files = {w for line in re.findall(r"^COPY (.+) /wheels/$", text, flags=re.M) for w in line.split() if "$" not in w}
    assert files == {"pyproject.toml", "scripts/install_deps.py"}
    assert files | {"Dockerfile", ".dockerignore"} == set(module.CONTEXT_FILES)
    assert module.dockerfile_arg("TORCH_VERSION") in module.wheel_requirements()[0]


def test_setup_installs_no_docker_engine_and_leaves_services_off():
    text = (ROOT / "scripts/setup.sh").read_text()
    run = set(re.search(r"APT_PACKAGES=\(([^)]*)\)", text).group(1).split())
    test = set(re.search(r"APT_TEST_PACKAGES=\(([^)]*)\)", text).group(1).split())
    assert not {"docker.io", "containerd", "docker-ce"} & (run | test)
    # make run gets what the stack runs; the container tools come with --test (make test)
    assert {"prometheus", "prometheus-alertmanager", "python3-bpfcc"} <= run
    assert {"podman", "mmdebstrap", "docker-compose"} <= test and not {"podman", "docker-compose"} & run
    assert "--no-install-recommends" in text  # docker-compose recommends docker.io
    assert "policy-rc.d" in text and "systemctl disable" in text
    assert "/usr/local/bin/inferd" in text
    assert "scripts/setup.sh" in (ROOT / "Makefile").read_text()


def test_podman_override_only_swaps_image_sources():
    base = compose()["services"]
    override = yaml.safe_load((ROOT / "compose.podman.yaml").read_text())["services"]
    assert set(override) <= set(base)
    for name, service in override.items():
        assert set(service) <= {"image", "entrypoint", "profiles"}, f"{name} overrides more than its image"
    left_out = {name for name, service in override.items() if "profiles" in service}
    assert left_out == {"grafana", "otel-collector"}
    entrypoints = {override[n]["entrypoint"][0] for n in ("prometheus", "alertmanager")}
    assert entrypoints == {"/usr/bin/prometheus", "/usr/bin/prometheus-alertmanager"}  # Debian's binaries
    # the user-facing file keeps the upstream images
    assert base["prometheus"]["image"].startswith("prom/prometheus:")
    assert base["alertmanager"]["image"].startswith("prom/alertmanager:")


def test_agent_commands_use_flags_the_agent_accepts():
    import argparse
    import shlex

    main = pytest.importorskip("inferd.agent.main", reason="agent/main.py has not landed")
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    known = {opt for action in parser._actions for opt in action.option_strings}
    token = re.search(r"credentials_file:\s*(\S+)", (ROOT / "alerts/alertmanager.yml").read_text()).group(1)
    for name in ("agent", "agent-cpu"):
        command = compose()["services"][name]["command"]
        script = command[-1].replace("$$", "$")
        words = shlex.split(script.split("inferd agent", 1)[1])
        flags = [w.split("=", 1)[0] for w in words if w.startswith("--")]
        assert flags and set(flags) <= known, f"{name}: unknown flags {set(flags) - known}"
        assert f"--webhook-token-file={token}" in words
        assert any(w.startswith("--model=") for w in words)


# ---- the stack for real: compose.yaml under podman ---------------------------------------

PODMAN_SCRIPT = ROOT / "scripts" / "compose_podman.py"
SMOKE_ALERT = "InferdComposeSmokeTest"
# One HTTP call, made inside the stack's network namespace (nsenter), printed as status + body.
HTTP_SNIPPET = """
import json, sys, urllib.error, urllib.request
method, url, body, headers = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
request = urllib.request.Request(url, data=body.encode() if body else None, method=method, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=30) as response:
        status, text = response.status, response.read().decode()
except urllib.error.HTTPError as exc:
    status, text = exc.code, exc.read().decode()
except OSError as exc:
    status, text = 0, str(exc)
print(status)
print(text)
"""


class Stack:
    """scripts/compose_podman.py with this test's project name and state folder."""

    def __init__(self, state: Path):
        self.env = {**os.environ, "COMPOSE_PROJECT_NAME": "inferd-test", "INFERD_PODMAN_DIR": str(state)}

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(PODMAN_SCRIPT), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def http(self, method: str, url: str, body: object = None, headers: dict | None = None) -> tuple[int, object]:
        data = "" if body is None else json.dumps(body)
        headers = {"content-type": "application/json", **(headers or {})}
        result = self.script(
            "exec", sys.executable, "-c", HTTP_SNIPPET, method, url, data, json.dumps(headers), timeout=60
        )
        status, _, text = result.stdout.partition("\n")
        try:
            return int(status or 0), json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            return int(status or 0), text

    def wait(self, what: str, check, timeout: float, every: float = 2.0):
        """Poll check() until it returns something truthy; fail with the last answer and the logs."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last and last[0]:
                return last
            time.sleep(every)
        logs = self.script("logs", timeout=60)
        pytest.fail(
            f"{what} not seen in {timeout:.0f} s; last answer {last!r}\n{logs.stdout[-6000:]}{logs.stderr[-2000:]}"
        )


def readme_image_size_gb() -> float:
    text = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    match = re.search(r"target `cpu` \(default, the CPU build of torch; ([\d.]+) GB", text)
    assert match, "README.md states no size for the cpu image"
    return float(match.group(1))


def check_agent_image(stack: Stack) -> None:
    """The image the stack runs: what runs and no more (no triton, no test extras), at the
    size README.md states."""
    image = "localhost/inferd:cpu"  # scripts/compose_podman.py AGENT_IMAGE
    env = {**stack.env, "CONTAINERS_CONF": str(Path(stack.env["INFERD_PODMAN_DIR"]) / "containers.conf")}
    size = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, env=env
    )
    assert size.returncode == 0, size.stderr
    measured, stated = int(size.stdout) / 1e9, readme_image_size_gb()
    assert abs(measured - stated) <= 0.05 * stated, f"{image} is {measured:.2f} GB; README.md says {stated} GB"
    probe = (
        "import importlib.util as u, sys; import xgrammar; "
        "sys.exit(', '.join(m for m in ('triton', 'pytest', 'lm_eval', 'schemathesis', 'mypy') if u.find_spec(m)) or None)"
    )
    found = subprocess.run(
        ["podman", "run", "--rm", "--network=none", image, "python", "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert found.returncode == 0, f"the image holds what does not run there: {found.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.usefixtures("live_ports")  # not beside `inferd stack up` (same ports), one .out/podman-test at a time
def test_compose_stack_serves_scrapes_and_alerts_under_podman():
    """compose.yaml brought up for real (podman's Docker API, docker-compose v1,
    compose.podman.yaml for the image sources), in a network namespace of its own: the
    engine answers a completion, Prometheus scrapes both targets and has the rules, and an
    alert posted to Alertmanager reaches the agent's webhook and its audit log."""
    if os.geteuid() != 0:
        pytest.skip(
            "podman runs containers on this host only as root (rootless podman needs subuids and "
            "user namespaces it does not offer)"
        )
    for binary in ("podman", "mmdebstrap", "docker-compose", "unshare", "nsenter", "ip"):
        assert shutil.which(binary), f"{binary} not installed; scripts/setup.sh installs it as root"
    stack = Stack(ROOT / ".out" / "podman-test")
    started = time.monotonic()
    up = stack.script("up", "--private-net", timeout=1200)
    try:
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-6000:]
        built = time.monotonic()

        # Alertmanager first: its route waits group_wait (30 s) before the first notification.
        stack.wait(
            "Alertmanager ready", lambda: (stack.http("GET", "http://localhost:9093/-/ready")[0] == 200,), 120, 1
        )
        alert = {
            "labels": {"alertname": SMOKE_ALERT, "remediate": "true", "instance": "localhost:8000", "severity": "info"},
            "annotations": {"summary": "tests/test_compose.py: an alert through Alertmanager to the agent"},
        }
        status, body = stack.http("POST", "http://localhost:9093/api/v2/alerts", [alert])
        assert status == 200, body

        # The engine: ready, then a completion through the port compose.yaml serves it on.
        stack.wait("engine /ready", lambda: (stack.http("GET", "http://localhost:8000/ready")[0] == 200,), 300)
        status, models = stack.http("GET", "http://localhost:8000/v1/models")
        assert status == 200, models
        model = models["data"][0]["id"]
        status, completion = stack.http(
            "POST",
            "http://localhost:8000/v1/completions",
            {"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0},
        )
        assert status == 200, completion
        assert completion["usage"]["completion_tokens"] >= 1 and isinstance(completion["choices"][0]["text"], str)
        # structured outputs: xgrammar runs in the image, which holds no triton
        status, choice = stack.http(
            "POST",
            "http://localhost:8000/v1/completions",
            {"model": model, "prompt": "Pick:", "max_tokens": 8, "guided_choice": ["red", "green", "blue"]},
        )
        assert status == 200, choice
        assert choice["choices"][0]["text"] in ("red", "green", "blue"), choice
        check_agent_image(stack)

        # Prometheus: both targets up, every rule of alerts/rules.yml loaded.
        def targets_up():
            status, body = stack.http("GET", "http://localhost:9090/api/v1/targets")
            if status != 200:
                return False, body
            health = {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}
            return health.get("inferd-agent") == "up" and health.get("inferd-engine") == "up", health

        stack.wait("Prometheus targets inferd-agent and inferd-engine up", targets_up, 120)
        status, rules = stack.http("GET", "http://localhost:9090/api/v1/rules")
        assert status == 200, rules
        loaded = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
        wanted = {
            r["alert"]
            for g in yaml.safe_load((ROOT / "alerts/rules.yml").read_text())["groups"]
            for r in g["rules"]
            if "alert" in r
        }
        assert wanted and wanted <= loaded, f"rules not loaded: {wanted - loaded}"

        # The alert: Alertmanager -> webhook (bearer token from the shared volume) -> audit log.
        def alert_recorded():
            status, body = stack.http("GET", "http://localhost:10400/v1/actions?limit=0")
            records = body.get("records", []) if isinstance(body, dict) else []
            return any(r.get("event") == "alert" and r.get("alert") == SMOKE_ALERT for r in records), status

        stack.wait(f"{SMOKE_ALERT} in the agent's /v1/actions", alert_recorded, 150)
        print(f"images {built - started:.0f} s, checks {time.monotonic() - built:.0f} s")
    finally:
        down = stack.script("down", timeout=300)
        left = subprocess.run(
            ["podman", "ps", "--all", "--quiet", "--filter", "label=com.docker.compose.project=inferd-test"],
            capture_output=True,
            text=True,
            env=stack.env,
        )
        assert down.returncode == 0, down.stderr[-4000:]
        assert left.stdout.strip() == "", f"containers left behind: {left.stdout}"
