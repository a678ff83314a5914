"""`inferd bench`: the engine's benchmarks (engine/bench/cli.py) and the agent's
`scenario`, which runs the whole closed loop. The engine never imports the agent, so the
agent's command table adds it here."""

from __future__ import annotations

import argparse

from inferd.engine.bench import cli as engine_bench

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    **engine_bench.SUBCOMMANDS,
    "scenario": (
        "inferd.agent.scenario.run",
        "the closed loop under a scripted workload, one way or (--ways all) default, best static and agent: "
        "SLO attainment timeline, summary table, targets",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_bench.add_arguments(parser, SUBCOMMANDS)


def run(args: argparse.Namespace) -> int:
    return engine_bench.run(args, SUBCOMMANDS)
