"""Wall time an engine spends in named methods, for splitting a request's latency into
its host phases without a profiler (a CUDA profiler inflates CUDA-graph launches by
instrumenting every captured kernel, and a Python profiler every call).

    with PhaseTimer({"schedule": (engine.scheduler, "schedule")}) as timer:
        ttft = time_to_first_token(engine, prompt)
    timer.totals  # {"schedule": seconds}

Each method is wrapped on its instance (so every holder of the object sees the wrapper)
and restored on exit; nested phases each count their own full time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class PhaseTimer:
    def __init__(self, phases: dict[str, tuple[Any, str]]):
        for name, (obj, method) in phases.items():
            if not callable(getattr(obj, method, None)):
                raise ValueError(f"phase {name!r}: {type(obj).__name__} has no method {method!r}")
        self.phases = phases
        self.totals: dict[str, float] = dict.fromkeys(phases, 0.0)
        self._wrapped: list[tuple[Any, str, Any]] = []  # (object, method, its own attribute or _CLASS)

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.phases, 0.0)

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - start

        return timed

    def __enter__(self) -> PhaseTimer:
        for name, (obj, method) in self.phases.items():
            before = vars(obj).get(method, _CLASS)  # an instance attribute already, or the class's
            setattr(obj, method, self._wrap(name, getattr(obj, method)))
            self._wrapped.append((obj, method, before))
        return self

    def __exit__(self, *exc) -> None:
        for obj, method, before in reversed(self._wrapped):
            if before is _CLASS:
                delattr(obj, method)
            else:
                setattr(obj, method, before)
        self._wrapped.clear()


_CLASS = object()  # the method was the class's: restoring it removes the instance's wrapper
