"""`inferd serve`: the OpenAI-compatible engine server.

    inferd serve --model DIR [--host 127.0.0.1] [--port 8000] [--served-model-name NAME]
                 [--admin-token-file F] [--otlp-endpoint URL] [--max-body-bytes N]
                 [--enable-fault-injection] [every EngineConfig field as --kebab-case]

Without --model the embedded default model (`inferd make-model --preset tiny`) is
written once under $XDG_CACHE_HOME/inferd/models/tiny (~/.cache when unset) and used.
The admin token comes from --admin-token-file or INFERD_ADMIN_TOKEN; with neither,
the admin API is off.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ..config import EngineConfig

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
DEFAULT_MODEL_PRESET = "tiny"


def default_model_dir(env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "inferd" / "models" / DEFAULT_MODEL_PRESET


def ensure_default_model(path: Path) -> Path:
    """Write the embedded default model at `path` unless it is already there. Written to
    a temporary sibling and renamed, so a crash never leaves a half-written model."""
    if (path / "config.json").is_file():
        return path
    from ..make_model import ModelSpec, make_model

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
    parser.add_argument("--model", help="checkpoint directory (default: the embedded tiny model, created once "
                        "under the user's cache folder)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--served-model-name", help="model name clients use (default: the --model argument)")
    parser.add_argument("--admin-token-file", help="file holding the admin bearer token (else INFERD_ADMIN_TOKEN; "
                        "with neither the admin API is off)")
    parser.add_argument("--otlp-endpoint", help="OTLP/HTTP collector, e.g. http://127.0.0.1:4318: one span per request")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="largest request body (default 4 MiB)")
    parser.add_argument("--enable-fault-injection", action="store_true",
                        help="allow POST /admin/fault (for remediation end-to-end tests)")
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



def served_name(model_arg: str | None) -> str:
    """The name clients use by default: the --model argument, as vLLM does, except for the
    embedded default model (given or implied), which is simply called by its preset."""
    if not model_arg or Path(model_arg).resolve() == default_model_dir().resolve():
        return DEFAULT_MODEL_PRESET
    return model_arg

def run(args: argparse.Namespace) -> int:
    import prometheus_client
    import uvicorn

    from ..llm_engine import LLMEngine
    from .admin import load_admin_token
    from .app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app
    from .async_engine import AsyncEngine

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
    except (ValueError, OSError) as exc:
        log.error("%s", exc)
        return 2
    prometheus_client.disable_created_metrics()  # as vLLM does: no *_created series
    engine = LLMEngine(config)
    # As vLLM does: what start-up allocated (the block pool's per-block objects, model and
    # torch state) lives as long as the server, so keep the collector from rescanning it;
    # a full collection over it paused a step by ~140 ms (docs/benchmarks/host_overhead.md).
    gc.collect()
    gc.freeze()
    settings = ServerSettings(
        served_model_name=args.served_model_name or served_name(args.model),
        admin_token=token,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        enable_fault_injection=args.enable_fault_injection,
    )
    tracer = None
    if args.otlp_endpoint:
        from .tracing import RequestTracer, make_tracer

        otel_tracer, provider = make_tracer(args.otlp_endpoint)
        tracer = RequestTracer(otel_tracer)
        settings.on_shutdown.append(provider.shutdown)
    if token is None:
        log.warning("admin API is off: no admin token (set INFERD_ADMIN_TOKEN or --admin-token-file)")
    if args.enable_fault_injection:
        log.warning("fault injection is enabled (POST /admin/fault)")
    app = create_app(AsyncEngine(engine, tracer=tracer), settings)
    # On SIGTERM, streams still open after 10 s are cut (their requests abort and free their blocks).
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), access_log=False,
                timeout_graceful_shutdown=10)
    return 0
