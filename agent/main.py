"""`inferd agent`: the per-node process.

Discovers the topology (sysfs), picks the NUMA node for the engine (agent.placement),
starts `inferd serve` bound to that node and keeps it alive (agent.supervisor), runs
every collector through one CollectorSet, serves /metrics, /healthz and /v1/topology
on 127.0.0.1:9400, and with --otlp-endpoint pushes the same metrics over OTLP/HTTP.

Exit status: 0 after SIGTERM/SIGINT (the engine is stopped first), 2 for bad
arguments (a --model that is not a model directory, an unreadable replay file). The
agent never exits because of its engine: an engine that keeps dying is restarted with
a growing backoff, and /healthz and the inferd_engine_* metrics say so.
"""
from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from pathlib import Path

log = logging.getLogger("inferd.agent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="model directory (HF format) for the engine")
    parser.add_argument("--host", default="127.0.0.1", help="agent listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9400, help="agent port (default 9400)")
    parser.add_argument("--gpu-backend", default="nvml", help="nvml (default) or replay:PATH")
    parser.add_argument("--gpu-interval", type=float, default=1.0, help="GPM sampling window in seconds (default 1)")
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    parser.add_argument("--procfs-root", type=Path, default=Path("/proc"))
    parser.add_argument("--otlp-endpoint", help="push metrics over OTLP/HTTP to this URL (e.g. http://127.0.0.1:4318)")
    parser.add_argument("--otlp-interval", type=float, default=10.0, help="seconds between OTLP pushes (default 10)")
    parser.add_argument("--engine-host", default="127.0.0.1", help="engine listen address (default 127.0.0.1)")
    parser.add_argument("--engine-port", type=int, default=8000, help="engine port (default 8000)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for `inferd serve` (repeatable)")
    parser.add_argument("--engine-command", help="run this command as the engine instead of `inferd serve` (testing)")
    parser.add_argument("--engine-ready-url", metavar="URL",
                        help="readiness URL the supervisor probes (default: the engine's /ready; "
                             "none with --engine-command unless given)")
    parser.add_argument("--no-engine", action="store_true", help="collect and export only; do not run the engine")
    parser.add_argument("--no-collector", action="append", default=[], metavar="NAME",
                        help="disable a collector: gpu, pcie, numa, ebpf (repeatable)")
    try:
        from exporters.ebpf_numa import add_watch_arguments
    except ImportError:
        pass
    else:
        add_watch_arguments(parser)
    try:
        from agent.webhook import add_arguments as add_webhook_arguments
    except ImportError:
        pass
    else:
        add_webhook_arguments(parser)


def model_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be the engine's model, or None when it looks like a checkpoint."""
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is not a directory"
    if not (path / "config.json").is_file():
        return f"{path} has no config.json (expected a Hugging Face model directory)"
    if not any(path.glob("*.safetensors")):
        return f"{path} has no *.safetensors weights"
    return None


def engine_command(args: argparse.Namespace) -> list[str]:
    if args.engine_command:
        return shlex.split(args.engine_command)
    return [
        sys.executable, "-m", "agent.cli", "serve", "--model", str(args.model),
        "--host", args.engine_host, "--port", str(args.engine_port), *args.engine_arg,
    ]


def discover_placement(sysfs_root: Path) -> tuple[dict | None, str | None, int | None, tuple[int, ...] | None]:
    """(topology dict, error, engine node, its CPUs); tolerant of a missing or odd sysfs."""
    try:
        from agent.placement import best_node_for_gpus
        from agent.topology import discover

        topology = discover(sysfs_root)
    except Exception as exc:
        log.warning("topology discovery failed, engine runs unbound: %s", exc)
        return None, f"{type(exc).__name__}: {exc}", None, None
    node = best_node_for_gpus(topology) if topology.gpus else None
    cpus = None
    if node is not None and topology.node(node) is not None:
        cpus = topology.node(node).cpus or None
    if node is None:
        log.info("no GPU or no NUMA node found; the engine runs unbound")
    return topology.to_dict(), None, node, cpus


def build_collectors(args, supervisor, bound_node):
    """The agent's collectors, in scrape order; each may be disabled by name."""
    from agent.supervisor import EngineCollector
    from exporters import gpu_backends
    from exporters.gpu import GpuCollector

    disabled = set(args.no_collector)
    collectors = []
    closers = []
    if "gpu" not in disabled:
        if args.gpu_backend.startswith("replay:"):
            backend = gpu_backends.open_backend(args.gpu_backend)  # a bad file fails now, clearly
        elif args.gpu_backend == "nvml":
            backend = gpu_backends.LazyBackend(lambda: gpu_backends.NvmlBackend(gpm_interval_s=args.gpu_interval))
        else:
            raise ValueError(f"--gpu-backend {args.gpu_backend!r}: use 'nvml' or 'replay:PATH'")
        collectors.append(GpuCollector(backend))
        closers.append(backend.close)
    engine_pid = lambda: supervisor.pid if supervisor is not None else None  # noqa: E731
    if "pcie" not in disabled:
        from exporters.pcie import PcieCollector

        collectors.append(PcieCollector(args.sysfs_root))
    if "numa" not in disabled:
        from exporters.numa import NumaCollector

        collectors.append(NumaCollector(args.sysfs_root, args.procfs_root, engine_pid_fn=engine_pid,
                                        bound_node_fn=lambda: bound_node))
    if "ebpf" not in disabled:
        try:
            from exporters.ebpf_numa import EbpfNumaCollector
        except ImportError as exc:
            log.info("eBPF collector not available: %s", exc)
        else:
            ebpf = EbpfNumaCollector(args.sysfs_root, args.procfs_root, watch_pids_fn=engine_pid,
                                     watch_pids=getattr(args, "watch_pid", ()), watch_comms=getattr(args, "watch_comm", ()))
            # loading probes compiles BPF programs; do not hold up the HTTP server for it
            threading.Thread(target=ebpf.start, name="ebpf-start", daemon=True).start()
            collectors.append(ebpf)
            if hasattr(ebpf, "stop"):
                closers.append(ebpf.stop)
    collectors.append(EngineCollector(supervisor))
    return collectors, closers


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from agent.otlp import OtlpConfig, OtlpPusher
    from agent.server import AgentState, create_app, load_extra_routers
    from agent.supervisor import Supervisor, SupervisorConfig
    from exporters.engine_metrics import EngineMetricsConfig, EngineMetricsReader

    def fail(message: str) -> int:
        print(f"inferd agent: {message}", file=sys.stderr)
        return 2

    if not args.no_engine and not args.engine_command:
        if args.model is None:
            return fail("--model DIR is required (or --no-engine)")
        problem = model_dir_problem(args.model)
        if problem:
            return fail(f"--model: {problem}")
    if not 0 < args.port < 65536 or not 0 < args.engine_port < 65536:
        return fail("--port and --engine-port must be 1..65535")

    topology, topology_error, node, cpus = discover_placement(args.sysfs_root)
    supervisor = None

    engine_url = f"http://{args.engine_host}:{args.engine_port}"
    if not args.no_engine:
        # a custom --engine-command need not serve /ready; then the process running counts as ready
        ready_url = args.engine_ready_url or (None if args.engine_command else f"{engine_url}/ready")
        try:
            config = SupervisorConfig(command=engine_command(args), cpus=cpus, mem_node=node, ready_url=ready_url)
        except ValueError as exc:
            return fail(str(exc))
        supervisor = Supervisor(config)
    try:
        collectors, closers = build_collectors(args, supervisor, node)
    except ValueError as exc:
        return fail(str(exc))

    engine_metrics = EngineMetricsReader(EngineMetricsConfig(url=f"{engine_url}/metrics")) if not args.no_engine else None
    otlp = None
    if args.otlp_endpoint:
        try:
            # sources are added below: the pusher reads the CollectorSet it is part of
            otlp = OtlpPusher(OtlpConfig(endpoint=args.otlp_endpoint, interval_s=args.otlp_interval), sources=[])
        except ValueError as exc:
            return fail(str(exc))
        collectors.append(otlp)
    state = AgentState.with_collectors(
        collectors, topology=topology, topology_error=topology_error,
        placement={"node": node, "cpus": list(cpus) if cpus else None,
                   "binding": supervisor.binding if supervisor else None},
        supervisor=supervisor, engine_metrics=engine_metrics, engine_url=engine_url,
    )
    if otlp:
        otlp.sources += [state.collectors.collect] + ([engine_metrics.read] if engine_metrics else [])

    state.extra["args"] = args  # agent.webhook builds the remediation policy from them
    try:
        routers = load_extra_routers(state, log=log.warning)
    except (OSError, ValueError) as exc:
        return fail(f"remediation: {exc}")
    policy = state.extra.get("remediation")
    if supervisor is not None and policy is not None:
        supervisor.add_ready_listener(policy.on_engine_ready)  # a fresh engine gets what is in force
    app = create_app(state, routers)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False))

    # uvicorn re-raises a captured SIGTERM/SIGINT after shutting down; a no-op handler
    # lets run() go on to stop the engine instead of dying with the child left behind.
    def on_signal(signum, frame) -> None:  # also covers a signal before uvicorn installs its own
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    log.info("agent on http://%s:%d (engine node %s, cpus %s)", args.host, args.port, node, cpus)
    try:
        if supervisor:
            supervisor.start()
        if otlp:
            otlp.start()
        server.run()
    finally:
        if supervisor:
            supervisor.stop()
        if otlp:
            otlp.stop()
        for close in closers:
            try:
                close()
            except Exception:
                log.exception("closing a collector failed")
    return 0

