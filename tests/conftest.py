"""Shared fixtures: tiny random checkpoints written once per test session (per xdist
worker: each worker has its own tmp_path_factory base directory, so no two processes
write one checkpoint), the live stack's ports, and the order xdist hands files out in."""

from __future__ import annotations

import pytest

from inferd.engine.model.make_model import ModelSpec, make_model

import interpreter_dot
from server_fixtures import live_stack_ports

# Kernels tested under Triton's interpreter get a dot that rounds the same for every tile
# shape on every processor, as tensor cores do (tests/interpreter_dot.py).
interpreter_dot.install()

# Under xdist (`make test`: -n auto --dist loadfile) a file is one work unit: its tests run
# on one worker, in order, and a module-scoped fixture (a server, an engine, a stack) is
# built once. The files that take longest on two cores (`pytest --durations=0`,
# 2026-12-02) are handed out first, so that no worker starts a long one while the others
# are nearly done; the rest follow in collection order. (`--dist loadgroup` and
# xdist_group marks would group by name, but pytest-xdist 3.8 marks the group in
# `item._nodeid`, which pytest 9.2 no longer reads: the marks are silently ignored.)
LONGEST_FIRST = (
    "test_async_decode.py",
    "test_compose.py",
    "test_server_lifecycle.py",
    "test_e2e_remediation.py",
    "test_engine_vs_hf.py",
    "test_openapi.py",
    "test_fast_path.py",
    "test_dashboards.py",
    "test_agent.py",
    "test_server_cli.py",
    "test_split_merge.py",
    "test_server_load.py",
    "test_tensor_parallel.py",
    "test_server_tracing.py",
    "test_engine_behaviour.py",
    "test_stack.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # a plain run keeps pytest's order
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


@pytest.fixture
def live_ports():
    """The live stack's fixed ports (8000, 9090, 9093, 10400) for one test: one live stack
    at a time across xdist workers and test runs (server_fixtures.live_stack_ports)."""
    with live_stack_ports():
        yield


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    """make_model(**spec) -> directory, cached by spec."""
    cache: dict[tuple, str] = {}

    def build(**spec) -> str:
        key = tuple(sorted((k, repr(v)) for k, v in spec.items()))
        if key not in cache:
            out = tmp_path_factory.mktemp("model")
            make_model(out, ModelSpec(**spec))
            cache[key] = str(out)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def tiny_model(model_factory) -> str:
    return model_factory(preset="tiny")


@pytest.fixture
def strict_fast_path(monkeypatch):
    """Fast-path exceptions propagate instead of sending the step to the portable path
    (engine/runner/fastpath_faults.py): a bug in our launch code fails the test that meets it."""
    from inferd.engine.runner.fastpath_faults import STRICT_ENV

    monkeypatch.setenv(STRICT_ENV, "1")
