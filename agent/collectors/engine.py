"""The engine collector's registry entry: inferd_engine_* from the supervisor.

`EngineCollector` lives beside the supervisor whose state it reads (agent.supervisor).
"""

from __future__ import annotations

from inferd.agent.supervisor import EngineCollector
from inferd.exporters.registry import BuildContext, Built, CollectorEntry


def build(context: BuildContext) -> Built:
    return Built(EngineCollector(context.supervisor))


ENTRY = CollectorEntry("engine", "the supervised engine: up, readiness state, restarts (none with --no-engine)", build)
