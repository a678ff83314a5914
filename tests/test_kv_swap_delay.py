"""The slow-swap fault: every block a swap copies costs the injected delay, in the same
step (engine/kv/kv_cache.py KVCache.inject_slow_swap)."""

from __future__ import annotations

import pytest
import torch

from inferd.engine.kv.block_pool import HOT
from inferd.engine.kv.kv_cache import KVCache


def cache() -> KVCache:
    return KVCache(1, 8, 8, 4, 2, 16, torch.float32, torch.device("cpu"), None)


def test_each_swapped_block_costs_the_injected_delay(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("inferd.engine.kv.kv_cache.time.sleep", slept.append)
    kv = cache()
    out = [((HOT, 0, 0), (HOT, 0, 0)), ((HOT, 1, 0), (HOT, 1, 0))]
    back = [((HOT, 2, 0), (HOT, 3, 0))]
    kv.swap(out, back)
    assert slept == []  # no fault: no delay
    kv.inject_slow_swap(0.02)
    kv.device_pool.hot[0].fill_(7.0)
    kv.swap(out, back)
    assert slept == [pytest.approx(0.06)]  # three blocks
    assert torch.equal(kv.host_pool.hot[0], kv.device_pool.hot[0])  # and the copies still happen
    kv.swap([], [])
    assert len(slept) == 1  # nothing swapped, nothing paid
    kv.inject_slow_swap(0)
    kv.swap(out, back)
    assert len(slept) == 1
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seconds_per_block"):
            kv.inject_slow_swap(bad)
