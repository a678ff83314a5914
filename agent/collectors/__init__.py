"""Registry entries for the collectors that report on the agent's own parts (the supervised
engine, its headroom, the OTLP push, the remediation policy). They live in the agent, not in exporters/,
because they read agent objects and exporters never import the agent; the agent lists
them after the exporters' own (`COLLECTOR_MODULES`)."""

from inferd.exporters.registry import ENTRY_MODULES

AGENT_ENTRY_MODULES = (
    "inferd.agent.collectors.engine",
    "inferd.agent.collectors.headroom",
    "inferd.agent.collectors.otlp",
    "inferd.agent.collectors.remediation",
)
COLLECTOR_MODULES = ENTRY_MODULES + AGENT_ENTRY_MODULES
