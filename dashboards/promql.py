"""Grafana's template variables in a board's PromQL, expanded the way Grafana would.

Used by `inferd report` and the tests to run a board's queries straight against
Prometheus: multi-value variables set to All become `.*` (the boards' allValue).
"""

from __future__ import annotations

import re

_LEGEND_RE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def expand(
    expr: str,
    *,
    rate_interval: str = "1m",
    interval: str = "15s",
    range_: str = "1h",
    variables: dict[str, str] | None = None,
) -> str:
    values = {"host": ".*", "gpu": ".*", "model_name": ".*", "slo_class": ".*", "instance": ".*", "job": ".*"}
    values.update(variables or {})
    out = expr.replace("$__rate_interval", rate_interval).replace("$__interval", interval).replace("$__range", range_)
    # longest names first so $model_name is not read as $model
    for name in sorted(values, key=len, reverse=True):
        out = out.replace(f"${name}", values[name])
    leftover = re.search(r"\$\w+", out)
    if leftover:
        raise ValueError(f"unexpanded variable {leftover.group(0)} in {expr!r}")
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: `{{label}}` replaced by the series' label value."""
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}"
    return _LEGEND_RE.sub(lambda m: labels.get(m.group(1), ""), fmt)
