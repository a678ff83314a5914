"""Building a dataclass from a mapping that must hold only the dataclass's own fields.

Configuration files, replay records and admin requests all come in as dicts; a key the
class does not know is a typo or a newer format, and silently dropping it would leave a
setting unapplied, so it is an error that names the unknown keys and the known ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def from_fields(cls: type[T], values: Mapping[str, Any], what: str) -> T:
    """`cls(**values)`, refusing keys that are not fields of `cls`; `what` names the
    thing in the error ("EngineConfig field", "remediation setting", ...)."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {what}(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**values)
