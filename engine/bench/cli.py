"""`inferd bench SUBCOMMAND`: `serve` (the HTTP server under rising offered load),
`burst` (the server against the offline engine on one burst of requests) and
`throughput` (the engine against transformers). Each subcommand's module is imported
only when its options are built, so `inferd bench serve` never imports transformers."""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "inferd.engine.bench.serve",
        "drive a server at rising offered loads: goodput and SLO attainment per class, latency, the knee",
    ),
    "burst": (
        "inferd.engine.bench.burst",
        "one burst of N requests, the server against the offline engine: tok/s ratio, TTFT, client CPU",
    ),
    "throughput": ("inferd.engine.bench.throughput", "engine tokens/s against transformers generate"),
    "tp-decode": ("inferd.engine.bench.tp_decode", "tensor-parallel decode and throughput, tp=1 against tp=2"),
    "gpu-decode": (
        "inferd.engine.bench.gpu_decode",
        "GPU fast path: batch-1 MBU, throughput vs roofline, transformers, prefix TTFT, swap (CUDA)",
    ),
}


def _chosen(argv: list[str], subcommands: dict[str, tuple[str, str]]) -> str | None:
    return next((a for a in argv if a in subcommands), None)


def add_arguments(parser: argparse.ArgumentParser, subcommands: dict[str, tuple[str, str]] = SUBCOMMANDS) -> None:
    """`subcommands`: these, or a table that adds to them (the agent's `bench scenario`)."""
    import sys

    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="{" + ",".join(subcommands) + "}")
    chosen = _chosen(sys.argv[1:], subcommands)
    for name, (module_name, help_text) in subcommands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Build only the chosen subcommand's options (or all of them for --help).
        if chosen in (None, name):
            importlib.import_module(module_name).add_arguments(p)


def run(args: argparse.Namespace, subcommands: dict[str, tuple[str, str]] = SUBCOMMANDS) -> int:
    module_name, _ = subcommands[args.bench_command]
    return int(importlib.import_module(module_name).run(args) or 0)
