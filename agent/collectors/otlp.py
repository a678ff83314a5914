"""The OTLP push's registry entry: with --otlp-endpoint, every collector's families (and
the engine's KV metrics) pushed over OTLP/HTTP; its own inferd_otlp_* counters on /metrics.

`OtlpPusher` is agent.otlp; disabling this collector turns the push off too.
"""

from __future__ import annotations

import argparse

from inferd.agent.otlp import OtlpConfig, OtlpPusher
from inferd.exporters.registry import BuildContext, Built, CollectorEntry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("otlp collector")
    group.add_argument("--otlp-endpoint", help="push metrics over OTLP/HTTP to this URL (e.g. http://127.0.0.1:4318)")
    group.add_argument("--otlp-interval", type=float, default=10.0, help="seconds between OTLP pushes (default 10)")


def build(context: BuildContext) -> Built | None:
    args = context.args
    if not args.otlp_endpoint:
        return None
    sources = [context.collectors.collect]  # the set this pusher is part of
    if context.engine_metrics is not None:
        sources.append(context.engine_metrics.read)
    pusher = OtlpPusher(OtlpConfig(endpoint=args.otlp_endpoint, interval_s=args.otlp_interval), sources=sources)
    return Built(pusher, start=pusher.start, close=pusher.stop)


ENTRY = CollectorEntry(
    "otlp",
    "with --otlp-endpoint: the OTLP/HTTP push of every metric and its drop/send counters",
    build,
    add_arguments=add_arguments,
)
