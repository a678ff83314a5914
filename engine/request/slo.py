"""SLO classes: named TTFT/TPOT targets a request is served against.

The server holds the configured classes (`SloClasses`, from `--slo-class` specs or a
YAML/JSON file); each request resolves to one class at the API and carries a
`RequestSlo` from there to its sequences, where the scheduler orders by slack. A class
without a TTFT target is best effort: it has no deadline, it is ordered as today (by
priority, aged, then arrival) and it is never shed by the deadline check.

With no class configured every request resolves to the implicit best-effort class
`default` and nothing differs from a server without SLO classes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CLASS = "default"
ON_MISS = ("reject", "demote")
# A class name is a Prometheus label value and a header value: short, plain characters.
CLASS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Targets outside these are typos (a TTFT in milliseconds given as seconds, or zero).
TTFT_RANGE_S = (0.001, 86400.0)
TPOT_RANGE_S = (0.0001, 3600.0)
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
SPEC_KEYS = ("ttft", "tpot", "priority", "on_miss")


def _target(name: str, value: Any, bounds: tuple[float, float]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{name} must be in [{bounds[0]:g}, {bounds[1]:g}] seconds, got {value!r}")
    return float(value)


@dataclass(slots=True, frozen=True)
class SloClass:
    name: str
    ttft_s: float | None = None
    """Time-to-first-token target in seconds; None: best effort (no deadline)."""
    tpot_s: float | None = None
    """Time-per-output-token target in seconds; None: none."""
    priority: int | None = None
    """vLLM priority given to the class's requests that do not send their own."""
    on_miss: str = "reject"
    """When a request cannot make its TTFT target: reject (429) or demote (serve as best effort)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not CLASS_NAME.match(self.name):
            raise ValueError(
                f"SLO class name must be 1-64 letters, digits, '_', '.' or '-' (starting with a letter or digit), "
                f"got {self.name!r}"
            )
        _target(f"{self.name}: ttft", self.ttft_s, TTFT_RANGE_S)
        _target(f"{self.name}: tpot", self.tpot_s, TPOT_RANGE_S)
        if self.priority is not None and (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not PRIORITY_RANGE[0] <= self.priority <= PRIORITY_RANGE[1]
        ):
            raise ValueError(
                f"{self.name}: priority must be an integer in [{PRIORITY_RANGE[0]}, {PRIORITY_RANGE[1]}], "
                f"got {self.priority!r}"
            )
        if self.on_miss not in ON_MISS:
            raise ValueError(f"{self.name}: on_miss must be one of {', '.join(ON_MISS)}; got {self.on_miss!r}")

    @property
    def is_best_effort(self) -> bool:
        return self.ttft_s is None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SloClass:
        if not isinstance(values, dict):
            raise ValueError(f"an SLO class must be a mapping, got {values!r}")
        unknown = set(values) - {"name", *SPEC_KEYS}
        if unknown:
            raise ValueError(
                f"SLO class {values.get('name')!r}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                f"allowed: name, {', '.join(SPEC_KEYS)}"
            )
        if "name" not in values:
            raise ValueError(f"an SLO class needs a name: {values!r}")
        return cls(
            values["name"],
            values.get("ttft"),
            values.get("tpot"),
            values.get("priority"),
            values.get("on_miss", "reject"),
        )

    @classmethod
    def parse(cls, spec: str) -> SloClass:
        """NAME[:ttft=SECONDS,tpot=SECONDS,priority=INT,on_miss=reject|demote]."""
        name, _, rest = spec.strip().partition(":")
        values: dict[str, Any] = {"name": name}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, sep, raw = item.partition("=")
            key, raw = key.strip(), raw.strip()
            if not sep or not raw:
                raise ValueError(f"SLO class {name!r}: {item!r} is not KEY=VALUE")
            if key in values:
                raise ValueError(f"SLO class {name!r}: {key} given twice")
            values[key] = raw if key in ("on_miss",) else _number(name, key, raw)
        return cls.from_dict(values)


def _number(name: str, key: str, raw: str) -> int | float | str:
    if key == "priority":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}: priority must be an integer, got {raw!r}") from None
    if key not in SPEC_KEYS:
        return raw  # from_dict names the unknown key
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}: {key} must be a number of seconds, got {raw!r}") from None


@dataclass(slots=True, frozen=True)
class RequestSlo:
    """What one request is served against; crosses to the engine core with the request."""

    class_name: str = DEFAULT_CLASS
    ttft_s: float | None = None
    tpot_s: float | None = None
    deadline: float | None = None
    """Wall-clock time (time.time()) its first token is due: arrival + ttft_s; None: best effort."""

    @property
    def is_best_effort(self) -> bool:
        return self.deadline is None


@dataclass(slots=True)
class SloClasses:
    """The configured classes and the one a request without a class gets."""

    classes: dict[str, SloClass] = field(default_factory=dict)
    default_class: str | None = None

    def __post_init__(self) -> None:
        if self.default_class is not None and self.default_class not in self.classes:
            known = ", ".join(sorted(self.classes)) or "none"
            raise ValueError(
                f"default SLO class {self.default_class!r} is not a configured class (configured: {known})"
            )

    @classmethod
    def build(cls, specs: list[SloClass], default_class: str | None = None) -> SloClasses:
        classes: dict[str, SloClass] = {}
        for spec in specs:
            if spec.name in classes:
                raise ValueError(f"SLO class {spec.name!r} is configured twice")
            classes[spec.name] = spec
        return cls(classes, default_class)

    @property
    def is_configured(self) -> bool:
        return bool(self.classes)

    @property
    def names(self) -> list[str]:
        """Every class a request may get, the implicit default included (metric labels)."""
        return sorted({*self.classes, self.default.name})

    @property
    def default(self) -> SloClass:
        if self.default_class is not None:
            return self.classes[self.default_class]
        return self.classes.get(DEFAULT_CLASS, SloClass(DEFAULT_CLASS))

    def get(self, name: str | None) -> SloClass:
        """The class called `name` (None: the default); KeyError for one not configured."""
        return self.default if name is None else self.classes[name]

    def request_slo(self, slo_class: SloClass, arrival: float) -> RequestSlo:
        deadline = None if slo_class.ttft_s is None else arrival + slo_class.ttft_s
        return RequestSlo(slo_class.name, slo_class.ttft_s, slo_class.tpot_s, deadline)


def load_slo_classes_file(path: str | Path) -> list[SloClass]:
    """A YAML or JSON list of {name, ttft, tpot, priority, on_miss} mappings."""
    import yaml  # JSON is YAML too

    text = Path(path).read_text()
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid YAML or JSON: {exc}") from None
    if isinstance(data, dict) and set(data) == {"slo_classes"}:
        data = data["slo_classes"]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of SLO classes, got {type(data).__name__}")
    return [SloClass.from_dict(item) for item in data]


def best_effort_seats(max_num_seqs: int, share: float) -> int:
    """Seats kept for best-effort sequences while deadline requests compete for them: `share`
    of max_num_seqs, at least one unless the share is 0 (the scheduler's rule, which
    admission's seat count follows)."""
    return 0 if share <= 0.0 else max(1, int(share * max_num_seqs))
