"""`inferd agent`: the per-node process.

Discovers the topology (sysfs), picks the NUMA node for the engine (agent.placement),
starts `inferd serve` bound to that node and keeps it alive (agent.supervisor), builds
the collectors of the registry (exporters.registry: gpu, pcie, numa, ebpf, engine, otlp,
remediation, less any --no-collector NAME) into one CollectorSet, serves /metrics,
/healthz and /v1/topology on 127.0.0.1:10400, and with --otlp-endpoint pushes the same
metrics over OTLP/HTTP.

With --kubernetes it runs no engine: it finds the engine pods on its own node through the
Kubernetes API and acts on them through their admin API, taking only the alerts about its
node (agent.kubernetes; docs/ADMIN.md, "Kubernetes mode").

Exit status: 0 after SIGTERM/SIGINT (the engine is stopped first), 2 for bad
arguments (a --model that is not a model directory, an unreadable replay file, a
collector name the registry does not know, an audit log it cannot append to). The
agent never exits because of its engine: an engine that keeps dying is restarted with
a growing backoff, and /healthz and the inferd_engine_* metrics say so.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
from pathlib import Path

import uvicorn

from inferd.agent.audit import AuditLogError
from inferd.agent.collectors import COLLECTOR_MODULES
from inferd.agent.kubernetes.node import add_arguments as add_kubernetes_arguments
from inferd.agent.placement import best_node_for_gpus
from inferd.agent.server import AgentState, create_app, load_extra_routers
from inferd.agent.supervisor import Supervisor, SupervisorConfig
from inferd.agent.topology import discover
from inferd.agent.webhook import add_arguments as add_webhook_arguments
from inferd.engine.server.http_limits import HttpLimits
from inferd.exporters.engine_metrics import EngineMetricsConfig, EngineMetricsReader
from inferd.exporters.registry import (
    BuildContext,
    Built,
    CollectorSet,
    add_collector_arguments,
    build_entries,
    enabled_names,
    load_entries,
)

log = logging.getLogger("inferd.agent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="model directory (HF format) for the engine")
    parser.add_argument("--host", default="127.0.0.1", help="agent listen address (default 127.0.0.1)")
    # 9100-9999, the Prometheus exporter range, is fully allocated (9400 is dcgm-exporter's);
    # 10400 sits outside it, off its outside-range table and clear of the kubelet's 10250-10259
    parser.add_argument("--port", type=int, default=10400, help="agent port (default 10400)")
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    parser.add_argument("--procfs-root", type=Path, default=Path("/proc"))
    parser.add_argument("--engine-host", default="127.0.0.1", help="engine listen address (default 127.0.0.1)")
    parser.add_argument("--engine-port", type=int, default=8000, help="engine port (default 8000)")
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `inferd serve` (repeatable)",
    )
    parser.add_argument("--engine-command", help="run this command as the engine instead of `inferd serve` (testing)")
    parser.add_argument(
        "--engine-ready-url",
        metavar="URL",
        help="readiness URL the supervisor probes (default: the engine's /ready; "
        "none with --engine-command unless given)",
    )
    parser.add_argument(
        "--engine-stall-restart-after",
        type=float,
        default=30.0,
        metavar="S",
        help="restart an engine whose /ready says stalled or dead, or that stops answering after it was "
        "ready, once it has been so for S seconds (default 30)",
    )
    parser.add_argument("--no-engine", action="store_true", help="collect and export only; do not run the engine")
    add_collector_arguments(parser, load_entries(COLLECTOR_MODULES))
    add_webhook_arguments(parser)
    add_kubernetes_arguments(parser)


def engine_load_format(engine_args: list[str]) -> str:
    """The --load-format the engine gets among the --engine-arg values (its default: auto)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--load-format", default="auto")
    known, _ = parser.parse_known_args(engine_args)
    return known.load_format


def model_dir_problem(path: Path, load_format: str = "auto") -> str | None:
    """Why `path` cannot be the engine's model, or None when it looks like a checkpoint
    (with load_format dummy the engine draws random weights: config.json is enough)."""
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is not a directory"
    if not (path / "config.json").is_file():
        return f"{path} has no config.json (expected a Hugging Face model directory)"
    if load_format != "dummy" and not any(path.glob("*.safetensors")):
        return f"{path} has no *.safetensors weights"
    return None


def engine_command(args: argparse.Namespace) -> list[str]:
    if args.engine_command:
        return shlex.split(args.engine_command)
    return [
        sys.executable,
        "-m",
        "inferd.agent.cli",
        "serve",
        "--model",
        str(args.model),
        "--host",
        args.engine_host,
        "--port",
        str(args.engine_port),
        *args.engine_arg,
    ]


def discover_placement(sysfs_root: Path) -> tuple[dict | None, str | None, int | None, tuple[int, ...] | None]:
    """(topology dict, error, engine node, its CPUs); tolerant of a missing or odd sysfs."""
    try:
        topology = discover(sysfs_root)
    except Exception as exc:
        log.warning("topology discovery failed, engine runs unbound: %s", exc)
        return None, f"{type(exc).__name__}: {exc}", None, None
    node = best_node_for_gpus(topology) if topology.gpus else None
    cpus: tuple[int, ...] | None = None
    numa_node = topology.node(node) if node is not None else None
    if numa_node is not None:
        cpus = numa_node.cpus or None
    if node is None:
        log.info("no GPU or no NUMA node found; the engine runs unbound")
    return topology.to_dict(), None, node, cpus


def close_all(built: list[Built]) -> None:
    """Close what the collectors hold, last built first (the OTLP push before its sources)."""
    for item in reversed(built):
        if item.close is None:
            continue
        try:
            item.close()
        except Exception:
            log.exception("closing collector %s failed", item.collector.name)


def run(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"inferd agent: {message}", file=sys.stderr)
        return 2

    kubernetes = getattr(args, "kubernetes", False)
    if kubernetes:
        args.no_engine = True  # the engines are pods that Kubernetes runs and restarts
    if not args.no_engine and not args.engine_command:
        if args.model is None:
            return fail("--model DIR is required (or --no-engine)")
        problem = model_dir_problem(args.model, engine_load_format(args.engine_arg))
        if problem:
            return fail(f"--model: {problem}")
    if not 0 < args.port < 65536 or not 0 < args.engine_port < 65536:
        return fail("--port and --engine-port must be 1..65535")
    entries = load_entries(COLLECTOR_MODULES)
    enabled = enabled_names(entries, args.collector, args.no_collector)  # argparse has checked the names

    topology, topology_error, node, cpus = discover_placement(args.sysfs_root)
    supervisor = None

    engine_url = f"http://{args.engine_host}:{args.engine_port}"
    if not args.no_engine:
        # a custom --engine-command need not serve /ready; then the process running counts as ready
        ready_url = args.engine_ready_url or (None if args.engine_command else f"{engine_url}/ready")
        try:
            config = SupervisorConfig(
                command=engine_command(args),
                cpus=cpus,
                mem_node=node,
                ready_url=ready_url,
                stall_restart_after_s=args.engine_stall_restart_after,
                # a custom --engine-command need not listen on the engine port
                engine_address=None if args.engine_command else (args.engine_host, args.engine_port),
            )
        except ValueError as exc:
            return fail(str(exc))
        supervisor = Supervisor(config)
    engine_metrics = (
        EngineMetricsReader(EngineMetricsConfig(url=f"{engine_url}/metrics")) if not args.no_engine else None
    )

    state = AgentState.with_collectors(
        # in Kubernetes mode the kubernetes collector reports each engine pod instead
        CollectorSet(disabled=({e.name for e in entries} - enabled) | ({"engine"} if kubernetes else set())),
        topology=topology,
        topology_error=topology_error,
        placement={
            "node": node,
            "cpus": list(cpus) if cpus else None,
            "binding": supervisor.binding if supervisor else None,
        },
        supervisor=supervisor,
        engine_metrics=engine_metrics,
        engine_url=engine_url,
    )
    context = BuildContext(
        args,
        enabled,
        state.collectors,
        supervisor=supervisor,
        bound_node=node,
        engine_metrics=engine_metrics,
        extra=state.extra,
    )
    built: list[Built] = []
    kube = None
    try:
        built += build_entries(entries, context)
        state.extra["args"] = args  # agent.webhook builds the remediation policy from them
        if kubernetes:
            from inferd.agent.kubernetes.node import build as build_kubernetes
            from inferd.agent.webhook import make_webhook_router

            try:
                kube = build_kubernetes(args)
            except AuditLogError as exc:  # a read-only audit path fails here, not at the first alert
                raise ValueError(f"remediation: {exc}") from None
            state.extra["remediation"] = kube.node.remediation
            state.collectors.add(kube.collector)
            routers = [make_webhook_router(state, kube.node.remediation, args.webhook_token_file)]
        else:
            try:
                routers = load_extra_routers(state, log=log.warning)
            except (OSError, ValueError) as exc:
                raise ValueError(f"remediation: {exc}") from None
        built += build_entries(entries, context, late=True)
    except ValueError as exc:
        close_all(built)
        return fail(str(exc))
    policy = state.extra.get("remediation")
    if supervisor is not None and policy is not None:
        supervisor.add_ready_listener(policy.on_engine_ready)  # a fresh engine gets what is in force
    app = create_app(state, routers)
    http_config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", access_log=False, **HttpLimits().uvicorn_options()
    )
    server = uvicorn.Server(http_config)

    # uvicorn re-raises a captured SIGTERM/SIGINT after shutting down; a no-op handler
    # lets run() go on to stop the engine instead of dying with the child left behind.
    def on_signal(signum, frame) -> None:  # also covers a signal before uvicorn installs its own
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    log.info(
        "agent on http://%s:%d (engine node %s, cpus %s; collectors %s)",
        args.host,
        args.port,
        node,
        cpus,
        ", ".join(state.collectors.names),
    )
    try:
        if supervisor:
            supervisor.start()
        if kube is not None:
            kube.node.start()
        for item in built:
            if item.start is not None:
                item.start()
        server.run()
    finally:
        if supervisor:
            supervisor.stop()
        if kube is not None:
            for close in kube.closers:
                close()
        close_all(built)
    return 0
