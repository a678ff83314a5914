"""The knee of a throughput-against-load curve, shared by `inferd bench serve` (which
reports it) and `inferd doctor` (which judges the current load against it); torch-free,
so the doctor does not import the engine to find it."""

from __future__ import annotations


def find_knee(loads: list[float], throughputs: list[float]) -> int | None:
    """Index of the knee: the load after which the slope of throughput over load falls
    the most (the most negative second difference). None with fewer than 3 levels or
    when the slope never falls."""
    if len(loads) != len(throughputs):
        raise ValueError(f"{len(loads)} loads but {len(throughputs)} throughputs")
    if len(loads) < 3:
        return None
    slopes = [(throughputs[i] - throughputs[i - 1]) / (loads[i] - loads[i - 1]) for i in range(1, len(loads))]
    second = [slopes[i] - slopes[i - 1] for i in range(1, len(slopes))]  # second[i-1] belongs to level i
    best = min(range(len(second)), key=lambda i: second[i])
    return best + 1 if second[best] < 0 else None
