"""The Kubernetes deployment (deploy/kubernetes/): every overlay renders, every object
validates against the Kubernetes and prometheus-operator schemas, the rules pass promtool,
the generated and rendered files match their sources, and the workloads say what the
design asks (least privilege for the agent, Guaranteed QoS and a drain for the engine,
probes on routes that exist, flags the programs accept)."""

from __future__ import annotations

import argparse
import base64
import copy
import importlib.util
import io
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
CRDS = ROOT / "tests" / "fixtures" / "reference" / "prometheus-operator"  # README.md there: source, version
K8S_VERSION = "1.32.0"  # one of the schema sets kubernetes-validate ships
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
)
CORE_GROUPS = ("v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1")


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_module("k8s_manifests", ROOT / "scripts" / "k8s_manifests.py")
ensure_tokens = _load_module("ensure_tokens", DEPLOY / "base" / "ensure_tokens.py")
OVERLAYS = generator.overlays()


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # libyaml when built in
    """YAML 1.2 as kustomize writes it: a bare `=` (YAML 1.1's value key) is a string."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc]


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} not installed ({package})")
    return path


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def rendered(overlay) -> list[dict[str, Any]]:
    """The overlay as committed under rendered/ (test_rendered_matches_kustomize keeps it
    equal to what kubectl kustomize makes of the overlay)."""
    return load_all((DEPLOY / "rendered" / f"{overlay}.yaml").read_text())


def objects(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def container(docs: list[dict], kind: str, name: str) -> dict:
    return one(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]


# --- one source, committed outputs ---------------------------------------------------


def test_there_are_gpu_and_cpu_demo_overlays():
    assert {"gpu", "cpu-demo"} <= set(OVERLAYS)


def test_generated_files_match_their_sources():
    problems = generator.drifted(
        generator.generated_files(), generator._stale(generator.generated_files(), generator.GENERATED, "*")
    )
    assert not problems, "run scripts/k8s_manifests.py:\n" + "\n".join(problems)


def test_drift_is_detected(tmp_path, monkeypatch):
    rules = yaml.safe_load((ROOT / "alerts" / "rules.yml").read_text())
    rules["groups"][0]["rules"][0]["for"] = "7m"
    changed = tmp_path / "rules.yml"
    changed.write_text(yaml.safe_dump(rules))
    monkeypatch.setattr(generator, "RULES", changed)
    files = generator.generated_files()
    assert generator.drifted(files, []) == [
        "deploy/kubernetes/base/generated/prometheusrule.yaml: differs from what the generator writes"
    ]


def test_rendered_matches_kustomize(overlay):
    kubectl = _tool("kubectl", "kubectl with its built-in kustomize")
    committed = (DEPLOY / "rendered" / f"{overlay}.yaml").read_text()
    assert generator.render(overlay, kubectl) == committed, (
        f"deploy/kubernetes/rendered/{overlay}.yaml is stale: run scripts/k8s_manifests.py"
    )


def test_check_mode_passes_on_the_committed_tree():
    _tool("kubectl", "kubectl with its built-in kustomize")
    assert generator.main(["--check"]) == 0


def test_prometheusrule_groups_are_the_rules_file(rendered):
    rule = one(rendered, "PrometheusRule", "inferd-rules")
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "alerts" / "rules.yml").read_text())["groups"]


def test_promtool_checks_the_prometheusrule(rendered, tmp_path):
    promtool = _tool("promtool", "Debian package prometheus")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": one(rendered, "PrometheusRule", "inferd-rules")["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanagerconfig_is_the_remediate_route(rendered):
    source = yaml.safe_load((ROOT / "alerts" / "alertmanager.yml").read_text())
    (route,) = [r for r in source["route"]["routes"] if r["receiver"] == "inferd-agent"]
    config = one(rendered, "AlertmanagerConfig", "inferd-remediation")["spec"]
    assert config["route"]["matchers"] == [{"name": "remediate", "value": "true", "matchType": "="}]
    assert config["route"]["groupBy"] == route["group_by"]
    assert (config["route"]["groupWait"], config["route"]["groupInterval"], config["route"]["repeatInterval"]) == (
        route["group_wait"],
        route["group_interval"],
        route["repeat_interval"],
    )
    (receiver,) = config["receivers"]
    assert receiver["name"] == config["route"]["receiver"]
    (webhook,) = receiver["webhookConfigs"]
    service = one(rendered, "Service", "inferd-agent")
    (port,) = service["spec"]["ports"]
    assert webhook["url"] == f"http://inferd-agent.{service['metadata']['namespace']}.svc:{port['port']}/v1/alerts"
    assert webhook["sendResolved"] is True
    credentials = webhook["httpConfig"]["authorization"]["credentials"]
    assert credentials["key"] in ensure_tokens.KEYS and credentials["name"] == "inferd-tokens"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('remediate = "true"', {"name": "remediate", "value": "true", "matchType": "="}),
        ('severity=~"warning|critical"', {"name": "severity", "value": "warning|critical", "matchType": "=~"}),
        ("team != ml", {"name": "team", "value": "ml", "matchType": "!="}),
    ],
)
def test_parse_matcher(text, expected):
    assert generator.parse_matcher(text) == expected


def test_parse_matcher_rejects_garbage():
    with pytest.raises(ValueError, match="cannot read"):
        generator.parse_matcher("remediate")


def test_dashboards_are_sidecar_configmaps(rendered):
    boards = sorted((ROOT / "dashboards" / "generated").glob("*.json"))
    maps = {
        m["metadata"]["name"]: m
        for m in objects(rendered, "ConfigMap")
        if "grafana_dashboard" in m["metadata"]["labels"]
    }
    assert sorted(maps) == [f"grafana-dashboard-{b.stem}" for b in boards]
    for board in boards:
        config_map = maps[f"grafana-dashboard-{board.stem}"]
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = json.loads(config_map["data"][board.name])
        original = json.loads(board.read_text())
        text = json.dumps(original).replace(
            '"uid": "inferd-prometheus"', f'"uid": "{generator.GRAFANA_DATASOURCE_UID}"'
        )
        assert shipped == json.loads(text)  # the datasource uid is the only change
        assert shipped["uid"] == original["uid"]
        assert len(json.dumps(config_map)) < 256 * 1024  # kubectl apply's last-applied annotation limit


# --- schemas -------------------------------------------------------------------------


def test_core_objects_validate_against_kubernetes(rendered):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra)")
    core = [d for d in rendered if d["apiVersion"] in CORE_GROUPS]
    assert {d["kind"] for d in core} >= {"DaemonSet", "Deployment", "Service", "Role", "NetworkPolicy", "Job"}
    for doc in core:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_validation_can_fail(rendered):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra)")
    daemonset = copy.deepcopy(one(rendered, "DaemonSet", "inferd-agent"))
    daemonset["spec"]["template"]["spec"]["hostPid"] = True  # misspelt hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSION, strict=True)


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as `kubectl apply --validate=strict` does."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators() -> dict[tuple[str, str], Any]:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra)")
    validators = {}
    for path in CRDS.glob("monitoring.coreos.com_*.yaml"):
        crd = yaml.load(path.read_text(), Loader=_Loader)
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            validators[key] = jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))
    return validators


def _crd_errors(validators, doc: dict) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validators[(doc["apiVersion"], doc["kind"])].iter_errors(doc)
    ]


def test_operator_objects_validate_against_the_crds(rendered, crd_validators):
    docs = [d for d in rendered if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {d["kind"] for d in docs} == {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig"}
    for doc in docs:
        assert not _crd_errors(crd_validators, doc), doc["metadata"]["name"]


def test_crd_validation_can_fail(rendered, crd_validators):
    monitor = copy.deepcopy(one(rendered, "ServiceMonitor", "inferd-agent"))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    config = copy.deepcopy(one(rendered, "AlertmanagerConfig", "inferd-remediation"))
    config["spec"]["route"]["matchers"][0]["matchType"] = "=="
    assert _crd_errors(crd_validators, monitor) and _crd_errors(crd_validators, config)


# --- labels and selectors ------------------------------------------------------------


def test_every_object_has_the_standard_labels(rendered):
    version = _project_version()
    for doc in rendered:
        labels = doc["metadata"].get("labels", {})
        missing = [key for key in STANDARD_LABELS if key not in labels]
        assert not missing, f"{doc['kind']}/{doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/version"] == version
        template = doc.get("spec", {}).get("template", {}).get("metadata")
        if template is not None:
            assert all(key in template["labels"] for key in STANDARD_LABELS), doc["metadata"]["name"]


def test_selectors_select_their_pods(rendered):
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in rendered
        if d["kind"] in ("DaemonSet", "Deployment")
    }
    for workload in ("inferd-agent", "inferd-engine"):
        for kind in ("Service", "ServiceMonitor", "NetworkPolicy"):
            doc = one(rendered, kind, workload)
            selector = (
                doc["spec"]["selector"]
                if kind == "Service"
                else (
                    doc["spec"]["selector"]["matchLabels"]
                    if kind == "ServiceMonitor"
                    else doc["spec"]["podSelector"]["matchLabels"]
                )
            )
            assert selector.items() <= pods[workload].items(), f"{kind}/{workload}"
            if kind == "ServiceMonitor":
                service = one(rendered, "Service", workload)
                assert selector.items() <= service["metadata"]["labels"].items()
    for kind in ("DaemonSet", "Deployment"):
        for doc in objects(rendered, kind):
            selector = doc["spec"]["selector"]["matchLabels"]
            assert "app.kubernetes.io/version" not in selector  # selectors are immutable; versions change
            assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()


def _project_version() -> str:
    import re

    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert match, "pyproject.toml has no version"
    return match.group(1)


# --- the agent -----------------------------------------------------------------------


def agent_parser() -> argparse.ArgumentParser:
    from inferd.agent.cli import command_parser

    return command_parser("agent")


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) as the kubelet expands it in args."""
    out = []
    for arg in args:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        out.append(arg)
    return out


def test_agent_arguments_parse(rendered):
    agent = container(rendered, "DaemonSet", "inferd-agent")
    assert agent["command"] == ["inferd", "agent"]
    args = agent_parser().parse_args(_expand(agent["args"], {"NODE_NAME": "gpu-node-1"}))
    assert args.host == "0.0.0.0"
    assert (args.sysfs_root, args.procfs_root) == (Path("/host/sys"), Path("/host/proc"))
    assert str(args.webhook_token_file).startswith("/etc/inferd/tokens/")
    assert args.kubernetes is True and args.node_name == "gpu-node-1"
    assert args.engine_port_name == "http"  # the engine container's port name
    assert args.node_label == "host"  # the label the ServiceMonitors set to the node's name
    assert args.alertmanager_url
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_agent_port_is_the_agents_default(rendered):
    default = agent_parser().get_default("port")
    agent = container(rendered, "DaemonSet", "inferd-agent")
    (arg,) = [a for a in agent["args"] if a.startswith("--port=")]
    (port,) = agent["ports"]
    (service_port,) = one(rendered, "Service", "inferd-agent")["spec"]["ports"]
    assert int(arg.split("=")[1]) == port["containerPort"] == service_port["port"] == default
    assert port["name"] == service_port["targetPort"] == "http"


def test_agent_probes_hit_its_health_route(rendered):
    from inferd.agent.server import AgentState, create_app

    routes = set(create_app(AgentState.with_collectors([])).openapi()["paths"])
    agent = container(rendered, "DaemonSet", "inferd-agent")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert agent[probe]["httpGet"]["path"] in routes
        assert agent[probe]["httpGet"]["port"] == "http"


def test_agent_has_least_privilege(rendered, overlay):
    daemonset = one(rendered, "DaemonSet", "inferd-agent")
    spec = daemonset["spec"]["template"]["spec"]
    agent = spec["containers"][0]
    security = agent["securityContext"]
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "PERFMON", "SYS_PTRACE"]}
    assert spec["priorityClassName"] == "system-node-critical"
    assert daemonset["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host_paths.values()) == {
        "/sys",
        "/proc",
        "/sys/kernel/tracing",
        "/lib/modules",
        "/usr/src",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/inferd",
    }
    writable = {host_paths[name] for name in host_paths if not mounts[name].get("readOnly")}
    assert writable == {"/var/lib/inferd"}  # the audit log; everything of the host's is read-only
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    affinity = spec.get("affinity", {}).get("nodeAffinity")
    if overlay == "gpu":
        (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]
        assert spec["runtimeClassName"] == "nvidia"
    else:
        assert affinity is None and "runtimeClassName" not in spec
        assert "--no-collector=gpu" in agent["args"]


def test_agent_rbac_is_namespaced_and_minimal(rendered):
    assert not objects(rendered, "ClusterRole") and not objects(rendered, "ClusterRoleBinding")
    (rule,) = one(rendered, "Role", "inferd-agent")["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]}
    binding = one(rendered, "RoleBinding", "inferd-agent")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "inferd-agent", "namespace": "inferd"}]
    spec = one(rendered, "DaemonSet", "inferd-agent")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "inferd-agent"


# --- the engine ----------------------------------------------------------------------


def test_engine_is_guaranteed_qos(rendered, overlay):
    spec = one(rendered, "Deployment", "inferd-engine")["spec"]["template"]["spec"]
    for each in spec["containers"] + spec.get("initContainers", []):
        requests, limits = each["resources"]["requests"], each["resources"]["limits"]
        assert requests == limits, each["name"]
        assert str(requests["cpu"]).isdigit() and int(requests["cpu"]) >= 1  # whole cores for the CPU Manager
        assert "memory" in requests
    gpus = spec["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpus is not None) == (overlay == "gpu")


def test_engine_arguments_parse_and_probe_real_routes(rendered, tiny_model):
    from inferd.agent.cli import command_parser

    engine = container(rendered, "Deployment", "inferd-engine")
    assert engine["command"] == ["inferd", "serve"]
    args = command_parser("serve").parse_args(engine["args"])
    assert args.host == "0.0.0.0" and args.port == engine["ports"][0]["containerPort"]
    assert args.admin_token_file.startswith("/etc/inferd/tokens/")

    from server_fixtures import build_app

    routes = set(build_app(tiny_model).openapi()["paths"])
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health" in routes
    assert engine["readinessProbe"]["httpGet"]["path"] == "/ready" in routes

    spec = one(rendered, "Deployment", "inferd-engine")["spec"]["template"]["spec"]
    pre_stop = engine["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # SIGTERM comes after preStop; the drain may take --shutdown-timeout, then up to 5 s
    # for idle connections (engine/server/cli.py); the grace period must cover all of it
    assert spec["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + args.shutdown_timeout + 5


def test_engine_runs_as_non_root_without_capabilities(rendered):
    spec = one(rendered, "Deployment", "inferd-engine")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = spec["containers"][0]["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert spec["automountServiceAccountToken"] is False


def test_engine_pods_are_what_the_agent_looks_for(rendered):
    agent = container(rendered, "DaemonSet", "inferd-agent")
    args = agent_parser().parse_args(_expand(agent["args"], {"NODE_NAME": "n"}))
    labels = one(rendered, "Deployment", "inferd-engine")["spec"]["template"]["metadata"]["labels"]
    wanted = dict(term.split("=", 1) for term in args.engine_label_selector.split(","))
    assert wanted.items() <= labels.items()
    (port,) = container(rendered, "Deployment", "inferd-engine")["ports"]
    assert port["name"] == args.engine_port_name
    # the engines' namespace is the agent's own (POD_NAMESPACE), where its Role lets it list pods
    env = {e["name"]: e for e in agent["env"]}
    assert args.engine_namespace is None
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


# --- scraping, network, tokens -------------------------------------------------------


def test_monitors_set_the_job_and_host_the_rules_and_boards_use(rendered):
    params = yaml.safe_load((ROOT / "alerts" / "params.yml").read_text())
    jobs = set(params["selectors"].values())
    for name in ("inferd-agent", "inferd-engine"):
        (endpoint,) = one(rendered, "ServiceMonitor", name)["spec"]["endpoints"]
        relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
        assert relabel["job"]["replacement"] == name and name in jobs
        assert relabel["host"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
        assert "node" not in relabel  # the NUMA series' own label
        assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"


def _peers(policy: dict) -> list[dict]:
    (rule,) = policy["spec"]["ingress"]
    return rule["from"]


def test_network_policies(rendered):
    agent_from = _peers(one(rendered, "NetworkPolicy", "inferd-agent"))
    names = sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in agent_from)
    assert names == ["alertmanager", "prometheus"]
    assert all("namespaceSelector" in p for p in agent_from)
    engine_from = _peers(one(rendered, "NetworkPolicy", "inferd-engine"))
    agent_labels = one(rendered, "DaemonSet", "inferd-agent")["spec"]["template"]["metadata"]["labels"]
    same_namespace = [p for p in engine_from if "namespaceSelector" not in p]
    assert len(same_namespace) == 1 and same_namespace[0]["podSelector"]["matchLabels"].items() <= agent_labels.items()
    for kind, name in (("DaemonSet", "inferd-agent"), ("Deployment", "inferd-engine")):
        (rule,) = one(rendered, "NetworkPolicy", name)["spec"]["ingress"]
        port_names = {p["name"] for p in container(rendered, kind, name)["ports"]}
        assert {p["port"] for p in rule["ports"]} <= port_names  # named ports resolve against the pod's
    tokens = one(rendered, "NetworkPolicy", "inferd-tokens")
    assert tokens["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in tokens["spec"]


def test_pods_mount_the_token_keys_the_job_creates(rendered):
    for kind, name in (("DaemonSet", "inferd-agent"), ("Deployment", "inferd-engine")):
        spec = one(rendered, kind, name)["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == "inferd-tokens"
        keys = [item["key"] for item in volume["secret"].get("items", [])] or list(ensure_tokens.KEYS)
        assert set(keys) <= set(ensure_tokens.KEYS)
        mount = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"]][0]
        for arg in spec["containers"][0]["args"]:
            if "token-file=" in arg:
                path = Path(arg.split("=", 1)[1])
                assert path.parent == Path(mount["mountPath"]) and path.name in keys
    job = one(rendered, "Job", "inferd-tokens")["spec"]["template"]["spec"]
    assert job["containers"][0]["command"][:2] == ["python", "/opt/inferd-tokens/ensure_tokens.py"]


class _SecretsApi:
    """The API server's Secret endpoints, as much as ensure_tokens uses: GET one, POST."""

    def __init__(self, existing: bool = False, conflict: bool = False, tls: tuple[Path, Path] | None = None):
        self.existing, self.conflict = existing, conflict
        self.requests: list[tuple[str, str, dict | None, str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                api.requests.append(("GET", self.path, None, self.headers.get("Authorization")))
                if api.existing:
                    self._reply(200, {"kind": "Secret", "metadata": {"name": "inferd-tokens"}})
                else:
                    self._reply(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.requests.append(("POST", self.path, body, self.headers.get("Authorization")))
                if api.conflict:
                    self._reply(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})
                else:
                    self._reply(201, body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:  # the API server's certificate, signed by the service account's CA
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*map(str, tls))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


@pytest.fixture
def service_account(tmp_path) -> Path:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "namespace").write_text("inferd")
    return tmp_path


@pytest.fixture
def secrets_api() -> Iterator[Any]:
    servers: list[_SecretsApi] = []

    def start(**kwargs) -> _SecretsApi:
        servers.append(_SecretsApi(**kwargs))
        return servers[-1]

    yield start
    for api in servers:
        api.server.shutdown()
        api.server.server_close()


def _run_tokens(api, account: Path) -> int:
    argv = ["--api", api.url, "--service-account-dir", str(account), "--label", "app.kubernetes.io/part-of=inferd"]
    return ensure_tokens.main(argv)


def test_tokens_job_creates_the_secret_once(secrets_api, service_account):
    api = secrets_api()
    assert _run_tokens(api, service_account) == 0
    (get, post) = api.requests
    assert get[:2] == ("GET", "/api/v1/namespaces/inferd/secrets/inferd-tokens") and get[3] == "Bearer sa-token"
    assert post[:2] == ("POST", "/api/v1/namespaces/inferd/secrets")
    secret = post[2]
    assert secret["metadata"] == {
        "name": "inferd-tokens",
        "namespace": "inferd",
        "labels": {"app.kubernetes.io/part-of": "inferd"},
    }
    tokens = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert set(tokens) == set(ensure_tokens.KEYS)
    assert all(len(t) == 64 and int(t, 16) >= 0 for t in tokens.values()) and len(set(tokens.values())) == 2


def test_tokens_job_speaks_tls_with_the_service_account_ca(secrets_api, service_account, tmp_path):
    openssl = _tool("openssl", "Debian package openssl")
    cert, key = tmp_path / "apiserver.crt", tmp_path / "apiserver.key"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=kubernetes",
        ]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    api = secrets_api(tls=(cert, key))
    (service_account / "ca.crt").write_bytes(cert.read_bytes())
    assert _run_tokens(api, service_account) == 0
    assert [r[0] for r in api.requests] == ["GET", "POST"]
    other = tmp_path / "other.crt"  # a CA that did not sign the server's certificate: refused, not downgraded
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other",
        ]
        + ["-keyout", str(tmp_path / "other.key"), "-out", str(other)],
        check=True,
        capture_output=True,
    )
    (service_account / "ca.crt").write_bytes(other.read_bytes())
    assert _run_tokens(api, service_account) == 1
    assert len(api.requests) == 2


def test_tokens_job_keeps_an_existing_secret(secrets_api, service_account):
    api = secrets_api(existing=True)
    assert _run_tokens(api, service_account) == 0
    assert [r[0] for r in api.requests] == ["GET"]


def test_tokens_job_loses_a_race_gracefully(secrets_api, service_account, capsys):
    api = secrets_api(conflict=True)
    assert _run_tokens(api, service_account) == 0
    assert "inferd-tokens exists" in capsys.readouterr().out


def test_tokens_job_reports_a_refusal(secrets_api, service_account, capsys, monkeypatch):
    api = secrets_api()
    monkeypatch.setattr(api, "conflict", False)

    def forbidden(*args, **kwargs):
        raise ensure_tokens.urllib.error.HTTPError(api.url, 403, "Forbidden", {}, io.BytesIO(b"secrets is forbidden"))  # type: ignore[arg-type]

    monkeypatch.setattr(ensure_tokens.urllib.request, "urlopen", forbidden)
    assert _run_tokens(api, service_account) == 1
    assert "answered 403" in capsys.readouterr().err
