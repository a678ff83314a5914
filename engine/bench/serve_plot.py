"""The PNG of `inferd bench serve`: against offered load, throughput (with the knee),
latency percentiles, and per SLO class the attainment share and the goodput."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _ms(value: float | None) -> float:
    return float("nan") if value is None else value


def plot(levels: list[dict[str, Any]], knee: int | None, path: Path, best_effort: frozenset[str] = frozenset()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = [lv["offered_rate"] for lv in levels]
    fig, ((ax1, ax2), (ax3, ax4)) = plt.subplots(2, 2, figsize=(11, 8.4))
    ax1.plot(loads, [lv["output_throughput"] for lv in levels], "o-", label="output tokens/s")
    ax1.set_ylabel("output tokens/s")
    ax1.set_title("throughput")
    for key, style, label in (
        ("median_ttft_ms", "o-", "TTFT p50"),
        ("p99_ttft_ms", "o--", "TTFT p99"),
        ("median_tpot_ms", "s-", "TPOT p50"),
        ("p99_tpot_ms", "s--", "TPOT p99"),
    ):
        ax2.plot(loads, [_ms(lv[key]) for lv in levels], style, label=label)
    ax2.set_yscale("log")
    ax2.set_ylabel("ms")
    ax2.set_title("latency")
    classes = list(levels[0]["per_class"]) if levels else []
    has_targets = bool(levels) and levels[0]["request_goodput"] is not None
    for name in classes:
        per = [lv["per_class"][name] for lv in levels]
        label = f"{name} (best effort)" if name in best_effort else name
        ax3.plot(loads, [_ms(c["attainment"]) for c in per], "o-", label=label)
        ax4.plot(loads, [_ms(c["request_goodput"]) for c in per], "o-", label=label)
    if len(classes) > 1:
        ax3.plot(loads, [_ms(lv["attainment"]) for lv in levels], "k:", label="all")
        ax4.plot(loads, [_ms(lv["request_goodput"]) for lv in levels], "k:", label="all")
    ax3.set_ylim(-0.02, 1.02)
    ax3.set_ylabel("share of sent requests meeting their SLO")
    ax3.set_title("SLO attainment" if has_targets else "SLO attainment (no targets set)")
    ax4.set_ylabel("requests/s meeting their SLO")
    ax4.set_title("goodput" if has_targets else "goodput (no targets set)")
    for ax in (ax1, ax2, ax3, ax4):
        ax.set_xlabel("offered load (requests/s)")
        if knee is not None:
            ax.axvline(loads[knee], color="red", linestyle=":", label=f"knee ({loads[knee]:g} req/s)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
