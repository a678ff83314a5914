"""The stack's static configuration: compose.yaml, Dockerfile, Prometheus, Alertmanager,
OpenTelemetry Collector and Grafana provisioning, checked with the distributions' tools."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
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
    assert {"agent", "agent-cpu", "prometheus", "alertmanager", "grafana", "otel-collector"} <= set(rendered["services"])


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
    for service in (gpu, cpu):
        assert service["build"] == "."
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
    assert jobs["inferd-agent"]["static_configs"][0]["targets"] == ["localhost:9400"]
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


def test_dockerfile_uses_official_images_and_the_setup_script():
    text = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert bases
    for base in bases:
        # Docker Official Images have no namespace (python:3.11-slim, debian:bookworm)
        assert "/" not in base.removeprefix("docker.io/library/"), f"{base} is not an official image"
    runs = re.findall(r"^RUN\s+(.+)$", text, flags=re.M)
    assert any(r.startswith("scripts/setup.sh") for r in runs)
    # the README/Makefile set-up runs the same script
    assert "scripts/setup.sh" in (ROOT / "Makefile").read_text()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_agent_commands_use_flags_the_agent_accepts():
    import argparse
    import shlex

    main = pytest.importorskip("agent.main", reason="agent/main.py has not landed")
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
