"""Shared fixtures: tiny random checkpoints written once per test session."""
from __future__ import annotations

import pytest

from engine.make_model import ModelSpec, make_model


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
