"""Connection limits of `inferd serve` (engine/server/http_limits.py): a connection that
sends nothing, part of a request head, a head trickled a byte at a time, or part of a
body is closed once its limit passes, not kept forever; whole requests are untouched."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from inferd.engine.server.cli import add_arguments, http_limits_from_args, make_server
from inferd.engine.server.http_limits import HttpLimits

LIMIT_S = 0.5
WAIT_S = 20.0  # how long the client waits before calling the connection kept open


async def echo_length(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        return await send({"type": "lifespan.shutdown.complete"})
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def limited_server(limits: HttpLimits) -> Iterator[int]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = make_server(echo_length, drain=None, log_level="warning", limits=limits)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with limited_server(HttpLimits(header_timeout_s=LIMIT_S, body_timeout_s=LIMIT_S)) as p:
        yield p


def read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes; a timeout means it kept the connection."""
    conn.settimeout(WAIT_S)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connected, said nothing
        b"POST /v1/completions HTTP/1.1\r\nHost: a\r\n",  # half a head
    ],
    ids=["nothing", "partial_head"],
)
def test_an_incomplete_head_is_closed(port, sent):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(sent)
        answer = read_until_closed(conn)
    if sent:
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    else:
        assert answer == b""


def test_a_head_trickled_byte_by_byte_is_cut_off(port):
    # Each byte comes well within the limit; the whole head takes 16 times as long.
    head = b"GET /x HTTP/1.1\r\nHost: a\r\nX-Slow: " + b"y" * 400 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as conn:
        with pytest.raises(OSError):  # writing to the connection the server closed
            for byte in head:
                conn.sendall(bytes([byte]))
                time.sleep(0.02)


def test_a_stalled_body_is_closed_after_a_request_on_the_same_connection(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
        conn.settimeout(WAIT_S)
        assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")
        conn.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + b"z" * 10)
        assert b" 200 " not in read_until_closed(conn)


def test_whole_requests_on_a_kept_alive_connection_are_served(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(WAIT_S)
        for size in (0, 5, 70000):
            conn.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % size + b"q" * size)
            answer = b""
            while not answer.endswith(b"\r\n\r\n" + str(size).encode()):
                answer += conn.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 ")


def test_cli_flags_and_their_bounds():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--header-timeout", "2", "--body-timeout", "3", "--keep-alive-timeout", "4"])
    assert http_limits_from_args(args) == HttpLimits(2.0, 3.0, 4, HttpLimits().max_header_bytes)
    defaults = http_limits_from_args(parser.parse_args([]))
    assert defaults == HttpLimits() and defaults.header_timeout_s > 0
    for bad in ({"header_timeout_s": 0}, {"body_timeout_s": -1}, {"keep_alive_timeout_s": 0}, {"max_header_bytes": 10}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            HttpLimits(**bad)
