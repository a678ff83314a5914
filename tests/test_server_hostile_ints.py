"""Integers past what the engine core's channel carries (a signed 64-bit integer): each is a
400 naming its field on both generation routes, never a 5xx, and the bounds themselves
still serve. Also where a token id the vocabulary lacks is named, and the admin API's 401."""

from __future__ import annotations

import httpx
import pytest

from server_fixtures import MODEL_NAME, assert_error, running_server

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(tiny_model):
    with running_server(tiny_model, max_model_len=64) as s:
        yield s


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def body_for(path: str, **fields) -> dict:
    if path == CHAT:
        return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    return {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2, **fields}


BOTH_ROUTES = [
    ("priority", 10**30),
    ("priority", 1e30),
    ("priority", INT64_MIN - 1),
    ("priority", INT64_MAX + 1),
    ("top_k", 2**64),
    ("top_k", -(2**64)),
    ("n", 2**64),
    ("seed", 2**64),
    ("min_tokens", 2**64),
    ("max_tokens", 2**64),
    ("prompt_logprobs", 2**64),
    ("stop_token_ids", [1, 2**64]),
    ("stop_token_ids", [-(2**64)]),
]
COMPLETIONS_ONLY = [
    ("logprobs", 2**64),
    ("best_of", 2**64),
    ("prompt", [1, 2**64]),
    ("prompt", [[1, 2], [3, -(2**70)]]),
]
CHAT_ONLY = [("max_completion_tokens", 2**64), ("top_logprobs", 2**64)]


@pytest.mark.parametrize(
    "path, field, value",
    [(p, f, v) for p in (COMPLETIONS, CHAT) for f, v in BOTH_ROUTES]
    + [(COMPLETIONS, f, v) for f, v in COMPLETIONS_ONLY]
    + [(CHAT, f, v) for f, v in CHAT_ONLY],
)
def test_integers_outside_int64_are_a_400_naming_the_field(server, path, field, value):
    fields = {field: value}
    if field == "top_logprobs":
        fields["logprobs"] = True
    assert_error(post(server, path, body_for(path, **fields)), 400, "outside the signed 64-bit", param=field)


def test_an_integer_of_many_digits_is_shown_short(server):
    r = post(server, COMPLETIONS, body_for(COMPLETIONS, priority=10**1000))
    assert_error(r, 400, "priority: an integer of 1001 digits is outside", param="priority")


def test_detokenize_tokens_outside_int64_are_a_400(server):
    r = httpx.post(f"{server.url}/detokenize", json={"model": MODEL_NAME, "tokens": [1, 2**64]}, timeout=30)
    assert_error(r, 400, param="tokens")


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("fields", [{"priority": INT64_MIN}, {"priority": INT64_MAX}, {"top_k": INT64_MAX}])
def test_the_int64_bounds_themselves_are_served(server, path, fields):
    r = post(server, path, body_for(path, temperature=0, **fields))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_unknown_stop_token_ids_name_stop_token_ids(server, path):
    r = post(server, path, body_for(path, stop_token_ids=[1, 10**9]))
    assert_error(r, 400, "stop_token_ids has unknown token id(s) [1000000000]", param="stop_token_ids")


def test_top_logprobs_out_of_range_names_top_logprobs(server):
    r = post(server, CHAT, body_for(CHAT, logprobs=True, top_logprobs=21))
    assert_error(r, 400, "top_logprobs must be in [0, 20]", param="top_logprobs")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}])
def test_admin_401_names_the_bearer_scheme(server, headers):
    r = httpx.get(f"{server.url}/admin/config", headers=headers, timeout=30)
    assert_error(r, 401, "admin token", param=None)
    assert r.headers["WWW-Authenticate"] == "Bearer"
