"""`inferd serve`: the OpenAI-compatible engine server.

    inferd serve --model DIR [--host 127.0.0.1] [--port 8000] [--served-model-name NAME]
                 [--admin-token-file F] [--otlp-endpoint URL] [--max-body-bytes N]
                 [--enable-fault-injection] [--shutdown-timeout S] [--stall-timeout S]
                 [--tool-call-parser {llama3_json,hermes,mistral}]
                 [--header-timeout S] [--body-timeout S] [--keep-alive-timeout S] [--max-header-bytes N]
                 [--slo-class NAME:ttft=S,tpot=S[,priority=N][,on_miss=reject|demote]]...
                 [--slo-classes-file PATH] [--default-slo-class NAME] [--slo-admission-margin X]
                 [--max-num-queued-reqs N] [--max-num-queued-tokens N]
                 [every EngineConfig field as --kebab-case]

The port is bound first (a busy port fails at once), then the engine core process
loads the model while /health answers 200 and /ready 503 `loading`. SIGTERM drains:
new requests get 503, those in flight finish (up to --shutdown-timeout), exit 0. When
the engine core dies the server exits 70 (EX_SOFTWARE) for its supervisor to restart.

Without --model the embedded default model (`inferd make-model --preset tiny`) is
written once under $XDG_CACHE_HOME/inferd/models/tiny (~/.cache when unset) and used.
The admin token comes from --admin-token-file or INFERD_ADMIN_TOKEN; with neither,
the admin API is off.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..config import EngineConfig
from ..model.make_model import ModelSpec, make_model
from ..request.slo import SloClass, SloClasses, load_slo_classes_file
from .admission import AdmissionConfig
from .http_limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DEFAULT_MAX_HEADER_BYTES,
    HttpLimits,
)
from .parent_death import follow_agent
from .tool_parsers.registry import TOOL_PARSERS

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
DEFAULT_MODEL_PRESET = "tiny"


def default_model_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "inferd" / "models" / DEFAULT_MODEL_PRESET


def ensure_default_model(path: Path) -> Path:
    """Write the embedded default model at `path` unless it is already there. Written to
    a temporary sibling and renamed, so a crash never leaves a half-written model."""
    if (path / "config.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=path.parent))
    try:
        make_model(tmp, ModelSpec(preset=DEFAULT_MODEL_PRESET))
        try:
            tmp.rename(path)
        except OSError:  # another process won the race
            if not (path / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("wrote the default model to %s", path)
    return path


def _engine_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineConfig) if f.name != "model"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="checkpoint directory (default: the embedded tiny model, created once under the user's cache folder)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--served-model-name", help="model name clients use (default: the --model argument)")
    parser.add_argument(
        "--admin-token-file",
        help="file holding the admin bearer token (else INFERD_ADMIN_TOKEN; with neither the admin API is off)",
    )
    parser.add_argument("--otlp-endpoint", help="OTLP/HTTP collector, e.g. http://127.0.0.1:4318: one span per request")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="largest request body (default 4 MiB)")
    parser.add_argument(
        "--enable-fault-injection",
        action="store_true",
        help="allow POST /admin/fault (for remediation end-to-end tests)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, how long requests in flight may run before they are aborted (default 30 s)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=10.0,
        help="/ready turns 503 engine_stalled when the engine core is silent this long (default 10 s)",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS),
        default=None,
        help="format the model writes tool calls in (default: the one its chat template names)",
    )
    http = parser.add_argument_group("connections", "limits on client connections")
    http.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="close a connection whose request head has not fully arrived this long after its start (or its "
        f"first byte on a kept-alive connection), with a 408 (default {DEFAULT_HEADER_TIMEOUT_S:g} s)",
    )
    http.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help=f"close a connection whose request body stops arriving this long (default {DEFAULT_BODY_TIMEOUT_S:g} s)",
    )
    http.add_argument(
        "--keep-alive-timeout",
        type=int,
        default=DEFAULT_KEEP_ALIVE_TIMEOUT_S,
        help=f"close an idle kept-alive connection after this many seconds (default {DEFAULT_KEEP_ALIVE_TIMEOUT_S})",
    )
    http.add_argument(
        "--max-header-bytes",
        type=int,
        default=DEFAULT_MAX_HEADER_BYTES,
        help=f"largest request head; a larger one gets a 400 (default {DEFAULT_MAX_HEADER_BYTES})",
    )
    slo = parser.add_argument_group("SLO classes", "targets requests choose with slo_class or X-SLO-Class")
    slo.add_argument(
        "--slo-class",
        action="append",
        default=[],
        metavar="NAME:ttft=S,tpot=S[,priority=N][,on_miss=reject|demote]",
        help="an SLO class (repeatable); targets in seconds; a class without ttft is best effort",
    )
    slo.add_argument("--slo-classes-file", help="a YAML or JSON list of {name, ttft, tpot, priority, on_miss}")
    slo.add_argument(
        "--default-slo-class",
        help="the class of requests that name none (default: best effort, as without classes)",
    )
    slo.add_argument(
        "--slo-admission-margin",
        type=float,
        default=0.0,
        help="refuse (429) a request whose predicted TTFT exceeds its class's target by more than this share of "
        "it (default 0: past the target; 1.0: past twice the target)",
    )
    slo.add_argument(
        "--max-num-queued-reqs",
        type=int,
        default=0,
        help="most sequences in flight, waiting or running; past it 503 (default 0: no cap)",
    )
    slo.add_argument(
        "--max-num-queued-tokens",
        type=int,
        default=0,
        help="most prompt tokens of requests before their first token; past it 503 (default 0: no cap)",
    )
    group = parser.add_argument_group("engine", "EngineConfig fields (see engine/config.py)")
    for f in _engine_fields():
        flag = "--" + f.name.replace("_", "-")
        doc = (f.metadata.get("doc") if f.metadata else None) or f"default {f.default!r}"
        if isinstance(f.default, bool):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=doc)
        else:
            group.add_argument(flag, dest=f.name, type=type(f.default), default=None, help=f"{doc}")


def engine_config_from_args(args: argparse.Namespace, model_dir: str) -> EngineConfig:
    values = {f.name: getattr(args, f.name) for f in _engine_fields() if getattr(args, f.name, None) is not None}
    return EngineConfig.from_dict({"model": model_dir, **values})


def slo_classes_from_args(args: argparse.Namespace) -> SloClasses:
    """The configured SLO classes; a ValueError naming the flag for a bad one."""
    specs: list[SloClass] = []
    if getattr(args, "slo_classes_file", None):
        try:
            specs += load_slo_classes_file(args.slo_classes_file)
        except (ValueError, OSError) as exc:
            raise ValueError(f"--slo-classes-file {args.slo_classes_file}: {exc}") from None
    for spec in getattr(args, "slo_class", None) or []:
        try:
            specs.append(SloClass.parse(spec))
        except ValueError as exc:
            raise ValueError(f"--slo-class {spec!r}: {exc}") from None
    try:
        classes = SloClasses.build(specs)
    except ValueError as exc:
        raise ValueError(f"--slo-class: {exc}") from None
    try:
        return SloClasses(classes.classes, getattr(args, "default_slo_class", None))
    except ValueError as exc:
        raise ValueError(f"--default-slo-class: {exc}") from None


def admission_from_args(args: argparse.Namespace) -> AdmissionConfig:
    """The admission settings; a ValueError naming the flag for a bad one."""
    try:
        return AdmissionConfig(
            getattr(args, "slo_admission_margin", 0.0),
            getattr(args, "max_num_queued_reqs", 0),
            getattr(args, "max_num_queued_tokens", 0),
        )
    except ValueError as exc:
        flag = "--" + str(exc).split(" ")[0].replace("_", "-")
        raise ValueError(f"{flag}: {exc}") from None


def served_name(model_arg: str | None) -> str:
    """The name clients use by default: the --model argument, as vLLM does, except for the
    embedded default model (given or implied), which is simply called by its preset."""
    if not model_arg or Path(model_arg).resolve() == default_model_dir().resolve():
        return DEFAULT_MODEL_PRESET
    return model_arg


EXIT_ENGINE_DEAD = 70  # EX_SOFTWARE


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the server's listening socket now, before the model loads: a busy port
    fails in a second, and clients meet a 503 `loading` rather than a refused connection."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def http_limits_from_args(args: argparse.Namespace) -> HttpLimits:
    return HttpLimits(args.header_timeout, args.body_timeout, args.keep_alive_timeout, args.max_header_bytes)


def make_server(app, drain, log_level: str = "info", limits: HttpLimits | None = None):
    """A uvicorn server whose first SIGTERM/SIGINT drains (see app.Drain) and exits 0;
    a second one stops at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        exit_code = 0

        def handle_exit(self, sig, frame) -> None:
            if drain.active or self.should_exit:
                return super().handle_exit(sig, frame)
            drain.active = True  # refuse new work from this instant on
            asyncio.get_event_loop().call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain_then_exit()))

        async def _drain_then_exit(self) -> None:
            await drain.run()
            self.should_exit = True

        def stop_after_engine_death(self, reason: str) -> None:
            self.exit_code = EXIT_ENGINE_DEAD
            # A moment for the failed requests' 503s to go out.
            asyncio.get_event_loop().call_later(0.5, setattr, self, "should_exit", True)

    # Drain already waited for the requests; this bounds what is left (idle keep-alives).
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="on",
        **(limits or HttpLimits()).uvicorn_options(),
    )
    return DrainingServer(config)


def run(args: argparse.Namespace) -> int:
    # the HTTP stack (fastapi, uvicorn, prometheus_client, pyzmq) loads when a server starts
    import prometheus_client

    from .admin import load_admin_token
    from .app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app
    from .core_client import EngineCoreClient

    orphaned = follow_agent(os.environ, signal.SIGTERM)  # SIGTERM drains
    if orphaned:
        log.error("%s; not starting", orphaned)
        return 1
    if not 0 < args.port < 65536:
        log.error("--port must be in [1, 65535], got %s", args.port)
        return 2
    model_dir = args.model or str(ensure_default_model(default_model_dir()))
    if not Path(model_dir, "config.json").is_file():
        log.error("--model %s: no config.json there; give a Hugging Face checkpoint directory", model_dir)
        return 2
    try:
        config = engine_config_from_args(args, model_dir)
        token = load_admin_token(args.admin_token_file)
        limits = http_limits_from_args(args)
        settings = ServerSettings(
            served_model_name=args.served_model_name or served_name(args.model),
            admin_token=token,
            max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
            enable_fault_injection=args.enable_fault_injection,
            shutdown_timeout_s=args.shutdown_timeout,
            tool_call_parser=args.tool_call_parser,
            slo_classes=slo_classes_from_args(args),
            admission=admission_from_args(args),
        )
        if args.otlp_endpoint:
            from .tracing import otlp_traces_url  # OpenTelemetry's SDK, only with --otlp-endpoint

            otlp_traces_url(args.otlp_endpoint)  # a bad URL fails here, not in the engine core
        client = EngineCoreClient(
            config,
            otlp_endpoint=args.otlp_endpoint,
            stall_timeout_s=args.stall_timeout,
            log_level=args.log_level.upper(),
        )
    except (ValueError, OSError) as exc:
        log.error("%s", exc)
        return 2
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", args.host, args.port, exc.strerror or exc)
        return 2
    prometheus_client.disable_created_metrics()  # as vLLM does: no *_created series
    if token is None:
        log.warning("admin API is off: no admin token (set INFERD_ADMIN_TOKEN or --admin-token-file)")
    if args.enable_fault_injection:
        log.warning("fault injection is enabled (POST /admin/fault)")
    app = create_app(client, settings)
    server = make_server(app, app.state.drain, args.log_level.lower(), limits)
    client.on_dead = server.stop_after_engine_death
    server.run(sockets=[sock])
    sock.close()
    return server.exit_code
