"""`inferd doctor`: run the checks against this node and print ranked findings.

Without --agent, --engine or --prometheus it uses the local stack's (agent.doctor.discover:
the running stack's state under --run-dir, else the default ports) and says where each
came from; --no-discover reads only what the flags name.

Exit status: 0 every check ok or skipped, 1 a warning, 2 a failure (docs/DOCTOR.md);
a bad option is also 2, with argparse's message, and prints no report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from inferd.agent.stack import DEFAULT_RUN_DIR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the stable JSON report (see --schema)")
    parser.add_argument("--schema", action="store_true", help="print the JSON report's JSON Schema and exit")
    parser.add_argument(
        "--agent", default=None, help="the agent's base URL, e.g. http://127.0.0.1:10400 (default: the local stack's)"
    )
    parser.add_argument(
        "--engine", default=None, help="the engine's base URL, e.g. http://127.0.0.1:8000 (default: the local stack's)"
    )
    parser.add_argument(
        "--prometheus",
        default=None,
        help="Prometheus base URL (default: the local stack's); without one, instant values only",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help="the local stack's state (`inferd stack up --run-dir`): endpoints not given as flags are taken from "
        "the stack running there, else from the default ports 10400, 8000 and 9090 if they answer "
        "(default: .out/stack in the repository)",
    )
    parser.add_argument(
        "--no-discover", action="store_true", help="read only the endpoints the flags name: no stack, no default ports"
    )
    parser.add_argument("--since", default="15m", help="the window Prometheus queries look back over (s, m, h, d)")
    parser.add_argument(
        "--active", action="store_true", help="also run the checks that load the GPU and host (copy bandwidth)"
    )
    parser.add_argument("--only", default="", help="comma-separated check or finding ids (placement,pcie.link,...)")
    parser.add_argument("--sysfs-root", default="/sys", help="sysfs mount to read")
    parser.add_argument("--procfs-root", default="/proc", help="procfs mount to read")
    parser.add_argument("--gpu-backend", default="nvml", help="nvml or replay:PATH")
    parser.add_argument("--engine-pid", type=int, default=None, help="the engine's pid (default: from --agent)")
    parser.add_argument(
        "--admin-token-file", default=None, help="the engine's admin token (default: $INFERD_ADMIN_TOKEN)"
    )
    parser.add_argument("--sweep", default=None, help="an `inferd bench serve` result JSON for the knee")


def options_from(args: argparse.Namespace):
    from .check import load_checks
    from .discover import NAMES, find
    from .inputs import DoctorOptions, parse_duration
    from .runner import select

    options = DoctorOptions(  # every flag checked before anything is probed
        agent_url=args.agent,
        engine_url=args.engine,
        prometheus_url=args.prometheus,
        since_s=parse_duration(args.since),
        active=args.active,
        only=tuple(name.strip() for name in args.only.split(",") if name.strip()),
        sysfs_root=args.sysfs_root,
        procfs_root=args.procfs_root,
        gpu_backend=args.gpu_backend,
        engine_pid=args.engine_pid,
        admin_token_file=args.admin_token_file,
        sweep_path=args.sweep,
    )
    select(load_checks(), options.only)
    if args.no_discover:
        return options
    found = find({"agent": args.agent, "engine": args.engine, "prometheus": args.prometheus}, args.run_dir)
    token_file = args.admin_token_file
    if token_file is None and not os.environ.get("INFERD_ADMIN_TOKEN"):
        token_file = found.admin_token_file
    return dataclasses.replace(
        options,
        agent_url=found.urls["agent"],
        engine_url=found.urls["engine"],
        prometheus_url=found.urls["prometheus"],
        admin_token_file=token_file,
        found=tuple((name, found.where[name]) for name in NAMES),
    )


def run(args: argparse.Namespace) -> int:
    from .render import to_json, to_text
    from .runner import diagnose
    from .schema import SCHEMA

    if args.schema:
        sys.stdout.write(json.dumps(SCHEMA, indent=2, sort_keys=True) + "\n")
        return 0
    try:
        diagnosis = diagnose(options_from(args))
    except ValueError as exc:
        print(f"inferd doctor: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(to_json(diagnosis))
    else:
        sys.stdout.write(to_text(diagnosis, colour=sys.stdout.isatty()))
    return diagnosis.exit_status
