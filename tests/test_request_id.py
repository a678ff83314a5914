"""X-Request-Id without a running engine: which id the middleware picks, and the 500 an
unexpected exception gets, which Starlette sends outside every middleware.
(tests/test_server_errors.py checks the header on a live server's routes.)"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from inferd.engine.server.middleware import client_request_id, response_request_id

from server_fixtures import build_app


@pytest.mark.parametrize(
    "headers, expected",
    [
        ([(b"x-request-id", b"abc-123")], "abc-123"),
        ([(b"X-Request-ID", b"  Root=1-5759e988;Parent=53995c3f  ")], "Root=1-5759e988;Parent=53995c3f"),
        ([(b"x-request-id", b"first"), (b"x-request-id", b"second")], "first"),
        ([(b"x-request-id", b"x" * 128)], "x" * 128),
        ([(b"x-request-id", b"x" * 129)], None),
        ([(b"x-request-id", b"has space")], None),
        ([(b"x-request-id", "caf\u00e9".encode("latin-1"))], None),
        ([(b"x-request-id", b"")], None),
        ([(b"x-other", b"abc")], None),
    ],
)
def test_client_request_id(headers, expected):
    assert client_request_id(headers) == expected


def test_response_request_id_prefers_the_clients_then_the_routes_then_a_fresh_one():
    assert response_request_id({"headers": [(b"x-request-id", b"mine")], "state": {"request_id": "cmpl-1"}}) == "mine"
    assert response_request_id({"headers": [], "state": {"request_id": "cmpl-1"}}) == "cmpl-1"
    scope: dict = {"headers": []}
    fresh = response_request_id(scope)
    assert fresh.startswith("req-") and response_request_id(scope) == fresh  # one id for the whole request


def test_an_unexpected_exception_still_answers_with_the_request_id(tiny_model):
    app = build_app(tiny_model)

    async def boom():
        raise ZeroDivisionError

    app.add_api_route("/boom", boom)

    async def call(headers: dict) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # no lifespan: no engine
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/boom", headers=headers)

    r = asyncio.run(call({"X-Request-Id": "trace-7"}))
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert r.headers.get_list("x-request-id") == ["trace-7"]
    r = asyncio.run(call({}))
    assert r.status_code == 500 and r.headers["x-request-id"].startswith("req-")
