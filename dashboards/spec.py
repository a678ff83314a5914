"""What a board shows, as plain data; `render.py` turns it into Grafana JSON.

Keeping the boards' content free of the Grafana SDK lets `inferd report` and the tests
read every query without importing it.

Selectors use the template variables `$host` and `$gpu` (and `$model_name` on the
Engine board). `host` is a label Prometheus adds from the scrape address
(prometheus/prometheus.yml), so the agent's and the engine's series share it.
"""

from __future__ import annotations

from dataclasses import dataclass

PANEL_KINDS = ("timeseries", "stat", "heatmap", "state-timeline", "bargauge")

# A panel whose source may be absent says so in its description; tests read the same
# sentence to know which empty panels are expected on a machine without that source.
REQUIREMENT_NOTES = {
    "gpu": "Needs a GPU (NVML) or the agent's replay GPU back end.",
    "pcie-sysfs": "Needs a GPU's PCIe path in sysfs (a real GPU host, or the agent's --sysfs-root fixture).",
    "aer": "Needs a kernel that exposes AER counters for the GPU's PCIe path.",
    "ebpf": "Needs the eBPF probes (root, CAP_BPF, bcc); empty where they cannot load.",
    "numa-binding": "Needs the engine bound to a NUMA node (the agent binds it to its GPU's node when the topology shows one).",
    "numa-balancing": "Needs automatic NUMA balancing on (kernel.numa_balancing = 1).",
    "fastpath": "Empty until the engine's fast path has failed once.",
    "remediation": "Empty until the remediation loop has acted on an alert.",
    "rollback": "Empty until the remediation loop has rolled an action back.",
    "alert": "Empty while no inferd alert fires.",
    "alert-pending": "Empty while no inferd alert is pending.",
    "slo-classes": "Needs SLO classes with a TTFT target on the engine (inferd serve --slo-class).",
}

THRESHOLD_COLORS = ("green", "yellow", "orange", "red", "blue", "purple", "transparent")


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str = ""

    def __post_init__(self) -> None:
        if not self.expr.strip():
            raise ValueError("Query.expr is empty")


@dataclass(frozen=True, slots=True)
class Threshold:
    """Colour from `value` upwards; the first step of a panel starts at -inf."""

    value: float | None
    color: str

    def __post_init__(self) -> None:
        if self.color not in THRESHOLD_COLORS:
            raise ValueError(f"Threshold.color {self.color!r} is not one of {THRESHOLD_COLORS}")


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    thresholds: tuple[Threshold, ...] = (Threshold(None, "green"),)
    requires: str | None = None
    min: float | None = None
    max: float | None = None
    width: int = 12
    height: int = 8
    stacked: bool = False
    headline: bool = False  # plotted by `inferd report`
    value_names: tuple[tuple[float, str], ...] = ()  # value mappings, e.g. 1 -> "degraded"

    def __post_init__(self) -> None:
        for name in ("title", "description", "unit"):
            if not getattr(self, name).strip():
                raise ValueError(f"panel {self.title!r}: {name} is empty")
        if self.kind not in PANEL_KINDS:
            raise ValueError(f"panel {self.title!r}: kind {self.kind!r} is not one of {PANEL_KINDS}")
        if not self.queries:
            raise ValueError(f"panel {self.title!r}: no queries")
        if self.requires is not None and self.requires not in REQUIREMENT_NOTES:
            raise ValueError(
                f"panel {self.title!r}: requires {self.requires!r} is not one of {sorted(REQUIREMENT_NOTES)}"
            )
        if not self.thresholds or self.thresholds[0].value is not None:
            raise ValueError(f"panel {self.title!r}: the first threshold must be the base step (value None)")
        values = [t.value for t in self.thresholds[1:]]
        numbers = [v for v in values if v is not None]
        if len(numbers) != len(values) or numbers != sorted(numbers):
            raise ValueError(f"panel {self.title!r}: threshold values must be numbers in ascending order")
        if not 1 <= self.width <= 24:
            raise ValueError(f"panel {self.title!r}: width {self.width} is outside 1..24")

    @property
    def full_description(self) -> str:
        if self.requires is None:
            return self.description
        return f"{self.description} {REQUIREMENT_NOTES[self.requires]}"


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: tuple[Panel, ...]

    def __post_init__(self) -> None:
        if not self.panels:
            raise ValueError(f"row {self.title!r} has no panels")


@dataclass(frozen=True, slots=True)
class Variable:
    """A query variable: `label_values(query, label)`, multi-select with All = `.*`."""

    name: str
    label: str
    query: str

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"variable name {self.name!r} is not an identifier")


@dataclass(frozen=True, slots=True)
class Board:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...]
    tags: tuple[str, ...] = ("inferd",)
    remediation_annotations: bool = True

    def __post_init__(self) -> None:
        if not (8 <= len(self.uid) <= 40) or not self.uid.replace("-", "").isalnum():
            raise ValueError(f"board uid {self.uid!r} must be 8-40 characters of letters, digits and '-'")
        titles = [p.title for p in self.panels]
        duplicated = {t for t in titles if titles.count(t) > 1}
        if duplicated:
            raise ValueError(f"board {self.uid}: panel titles used twice: {sorted(duplicated)}")

    @property
    def panels(self) -> list[Panel]:
        return [p for row in self.rows for p in row.panels]


@dataclass(frozen=True, slots=True)
class Annotation:
    """A Prometheus annotation query; with `value_is_time` the sample value (ms) places the event."""

    name: str
    expr: str
    title: str
    color: str
    value_is_time: bool = False
    requires: str | None = None

    def __post_init__(self) -> None:
        if self.requires is not None and self.requires not in REQUIREMENT_NOTES:
            raise ValueError(
                f"annotation {self.name!r}: requires {self.requires!r} is not one of {sorted(REQUIREMENT_NOTES)}"
            )
