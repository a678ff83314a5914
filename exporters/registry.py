"""The agent's collectors: which there are (the registry) and how each scrape runs them
(`CollectorSet`: every collector timed and guarded).

The registry (node_exporter's `registerCollector`): each collector's own file defines an
``ENTRY = CollectorEntry(name, description, build, default_on, add_arguments)``, and
`ENTRY_MODULES` lists those files in scrape order (the agent appends the entries of its own
parts, agent.collectors, since exporters never import the agent). The agent adds each entry's options,
offers the names to ``--collector`` / ``--no-collector`` (any other name is an argparse
error, exit 2), and builds the enabled ones from a `BuildContext`: its arguments and the
objects it made (supervisor, engine metrics reader, the CollectorSet being filled). An
entry's build returns a `Built` (the collector, and what to call when the agent starts
and stops), or None when there is nothing to collect here (no --otlp-endpoint, no
remediation policy). A `late` entry is built after the agent's HTTP modules have run,
because it reads what they made (agent.webhook makes the remediation policy).

Collector isolation:

A collector is any object with a ``name`` attribute and a ``collect()`` method that
yields ``prometheus_client`` metric families (client_python's custom-collector
interface). `CollectorSet` runs each one per scrape, materialises its output so a
failure half-way drops only that collector's families, and always emits

    inferd_collector_up{collector="..."}                1 or 0
    inferd_collector_duration_seconds{collector="..."}  time spent collecting

    inferd_collector_source_absent{collector="..."}     1 or 0

so one failing source never fails a scrape (client_python on its own would).
A collector that knows why it cannot read its source raises `CollectorUnavailable`
with the reason: `up` is 0. A collector whose source is not there by nature on this
host (no NVML library or no NVIDIA GPU for the gpu collector, no NVIDIA GPU on the PCI
bus for pcie) raises `SourceAbsent`, a kind of `CollectorUnavailable`: it did its job
and found nothing to read, so `up` stays 1 and `source_absent` is 1. `up` 0 thus
always means a source that should be readable was not. Reasons are logged once per
change, not on every scrape.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as _PromCollector

log = logging.getLogger(__name__)


class CollectorUnavailable(Exception):
    """The collector's source cannot be read (file missing, not permitted, device error)."""


class SourceAbsent(CollectorUnavailable):
    """The collector's source does not exist on this host (no GPU, no NVML library):
    nothing to read, and nothing wrong."""


class Collector(Protocol):
    name: str

    def collect(self) -> Iterable[Metric]: ...


class CollectorSet(_PromCollector):
    """Runs its collectors on every scrape. A name in `disabled` is never added, whoever
    adds it: modules that add their own collector (agent.webhook) honour --no-collector too."""

    def __init__(self, collectors: Iterable[Collector] = (), disabled: Iterable[str] = ()):
        self._collectors: list[Collector] = []
        self._last_error: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self.disabled = frozenset(disabled)
        for c in collectors:
            self.add(c)

    def add(self, collector: Collector) -> None:
        if collector.name in self.disabled:
            log.info("collector %s disabled (--no-collector %s)", collector.name, collector.name)
            return
        names = {c.name for c in self._collectors}
        if collector.name in names:
            raise ValueError(f"collector {collector.name!r} registered twice")
        self._collectors.append(collector)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self._collectors]

    def describe(self) -> list[Metric]:
        # Returning nothing tells client_python not to call collect() at register time
        # and not to check for name clashes, which we cannot know before a scrape.
        return []

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "inferd_collector_up", "1 if the collector read its source on this scrape, else 0", labels=["collector"]
        )
        duration = GaugeMetricFamily(
            "inferd_collector_duration_seconds", "Time the collector took on this scrape", labels=["collector"]
        )
        absent = GaugeMetricFamily(
            "inferd_collector_source_absent",
            "1 if the collector's source does not exist on this host (no GPU, no NVML library), else 0",
            labels=["collector"],
        )
        with self._lock:  # concurrent scrapes would double the load on slow sources
            for collector in self._collectors:
                start = time.perf_counter()
                families, error, is_absent = self._run_one(collector)
                duration.add_metric([collector.name], time.perf_counter() - start)
                up.add_metric([collector.name], 0.0 if error and not is_absent else 1.0)
                absent.add_metric([collector.name], 1.0 if is_absent else 0.0)
                self._log_change(collector.name, error, is_absent)
                yield from families
        yield up
        yield duration
        yield absent

    @staticmethod
    def _run_one(collector: Collector) -> tuple[list[Metric], str | None, bool]:
        """(families, reason it read nothing or None, whether its source is absent)."""
        try:
            return list(collector.collect()), None, False
        except SourceAbsent as exc:
            return [], str(exc) or "source absent", True
        except CollectorUnavailable as exc:
            return [], str(exc) or "unavailable", False
        except Exception as exc:  # a collector bug must not fail the scrape
            log.exception("collector %s failed", collector.name)
            return [], f"{type(exc).__name__}: {exc}", False

    def _log_change(self, name: str, error: str | None, is_absent: bool = False) -> None:
        if self._last_error.get(name, "unset") == error:
            return
        self._last_error[name] = error
        if error and is_absent:
            log.info("collector %s: source absent on this host, nothing to collect: %s", name, error)
        elif error:
            log.warning("collector %s down: %s", name, error)
        else:
            log.info("collector %s up", name)


# ---- the registry ----

ENTRY_MODULES = (
    "inferd.exporters.gpu",
    "inferd.exporters.pcie",
    "inferd.exporters.numa",
    "inferd.exporters.ebpf_numa",
)
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(slots=True)
class BuildContext:
    """What an entry builds its collector from: the agent's arguments and objects."""

    args: argparse.Namespace
    enabled: frozenset[str]
    collectors: CollectorSet  # the set being filled; the OTLP push reads all of it
    supervisor: Any = None  # agent.supervisor.Supervisor; None with --no-engine
    bound_node: int | None = None  # the NUMA node the engine is bound to
    engine_metrics: Any = None  # exporters.engine_metrics.EngineMetricsReader; None with --no-engine
    extra: dict[str, Any] = field(default_factory=dict)  # AgentState.extra: the remediation policy, once made

    def engine_pid(self) -> int | None:
        """The engine's pid now (it changes on every restart), or None."""
        return self.supervisor.pid if self.supervisor is not None else None


@dataclass(frozen=True, slots=True)
class Built:
    collector: Collector
    start: Callable[[], None] | None = None  # called once, as the agent starts serving
    close: Callable[[], None] | None = None  # called once, as the agent stops


@dataclass(frozen=True, slots=True)
class CollectorEntry:
    name: str  # the collector's name: its `collector` label and its --no-collector value
    description: str
    build: Callable[[BuildContext], Built | None]
    default_on: bool = True
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    late: bool = False

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"collector name {self.name!r} must be snake_case")
        if not self.description:
            raise ValueError(f"collector {self.name!r} needs a description")


def load_entries(modules: Iterable[str] = ENTRY_MODULES) -> list[CollectorEntry]:
    """Every module's ENTRY, in the order given; a name used twice is an error."""
    entries: list[CollectorEntry] = []
    for module_name in modules:
        entry = importlib.import_module(module_name).ENTRY
        if not isinstance(entry, CollectorEntry):
            raise TypeError(f"{module_name}.ENTRY is a {type(entry).__name__}, not a CollectorEntry")
        if entry.name in {e.name for e in entries}:
            raise ValueError(f"collector {entry.name!r} registered twice ({module_name})")
        entries.append(entry)
    return entries


def add_collector_arguments(parser: argparse.ArgumentParser, entries: list[CollectorEntry]) -> None:
    """--collector / --no-collector (choices: the registry's names) and each entry's own options."""
    names = [e.name for e in entries]
    listing = "; ".join(f"{e.name}{'' if e.default_on else ' (off by default)'}: {e.description}" for e in entries)
    group = parser.add_argument_group("collectors", listing)
    group.add_argument(
        "--collector",
        action="append",
        default=[],
        choices=names,
        metavar="NAME",
        help=f"enable a collector that is off by default (repeatable; one of {', '.join(names)})",
    )
    group.add_argument(
        "--no-collector",
        action="append",
        default=[],
        choices=names,
        metavar="NAME",
        help=f"disable a collector (repeatable; one of {', '.join(names)})",
    )
    for entry in entries:
        if entry.add_arguments is not None:
            entry.add_arguments(parser)


def enabled_names(
    entries: list[CollectorEntry], enable: Iterable[str] = (), disable: Iterable[str] = ()
) -> frozenset[str]:
    """The names to build: on by default or enabled, and not disabled (disabling wins)."""
    known = {e.name for e in entries}
    unknown = sorted((set(enable) | set(disable)) - known)
    if unknown:
        raise ValueError(f"unknown collector(s) {', '.join(unknown)}; known: {', '.join(e.name for e in entries)}")
    wanted = {e.name for e in entries if e.default_on} | set(enable)
    return frozenset(wanted - set(disable))


def build_entries(entries: list[CollectorEntry], context: BuildContext, late: bool = False) -> list[Built]:
    """Build the enabled entries of one phase (late or not) into context.collectors.
    ValueError (a bad option) propagates for the agent to report."""
    built_all = []
    for entry in entries:
        if entry.late != late or entry.name not in context.enabled:
            continue
        built = entry.build(context)
        if built is None:
            log.debug("collector %s: nothing to collect on this agent", entry.name)
            continue
        if built.collector.name != entry.name:
            raise ValueError(f"entry {entry.name!r} built a collector named {built.collector.name!r}")
        context.collectors.add(built.collector)
        built_all.append(built)
    return built_all
