"""The burst's load generator: N completions sent at once, one connection each.

It has to stay out of the way of the figure it takes, so it is as thin as it can be:
one asyncio event loop, plain HTTP/1.1 over asyncio streams (no client library between
the socket and the bytes), request bodies encoded before the clock starts, and per
streamed chunk nothing but a `json.loads` of its `data:` line. It reports its own CPU
time over the burst, so a reader can see that the client was not the bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(slots=True)
class RequestResult:
    status: int = 0
    num_tokens: int = -1  # usage.completion_tokens; -1 when the server sent no usage
    num_chunks: int = 0  # streaming: chunks carrying a choice
    finish_reason: str | None = None
    ttft: float = math.nan  # streaming: first chunk carrying text, seconds from the burst's start
    e2e: float = math.nan  # seconds from the burst's start to the end of the response
    error: str = ""


@dataclass(slots=True)
class BurstResult:
    requests: list[RequestResult]
    wall_s: float  # from the first send to the last response's end
    client_cpu_s: float  # this process's CPU time over the same span


def completion_body(
    model: str, prompt: list[int], max_tokens: int, stream: bool, sampling: dict | None = None
) -> bytes:
    """`sampling`: the request's sampling fields (default greedy)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        **(sampling or {}),
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


def _request_head(host: str, port: int, path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ConnectionError(f"bad status line {status_line[:80]!r}")
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]):
    """The response body as it arrives: chunked (how the server streams) or sized."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readline() not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)  # the CRLF after each chunk
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        yield await reader.read()  # until the server closes


def _take_usage(result: RequestResult, payload: dict) -> None:
    usage = payload.get("usage")
    if usage:
        result.num_tokens = usage["completion_tokens"]


async def _exchange(host: str, port: int, payload: bytes, stream: bool, start: float, result: RequestResult) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_request_head(host, port, "/v1/completions", len(payload)) + payload)
        result.status, headers = await _read_head(reader)
        if result.status != 200 or not stream:
            body = b"".join([piece async for piece in _body(reader, headers)])
            if result.status != 200:
                result.error = f"HTTP {result.status}: {body[:200].decode(errors='replace')}"
                return
            response = json.loads(body)
            _take_usage(result, response)
            result.finish_reason = response["choices"][0]["finish_reason"]
            return
        pending = b""
        async for piece in _body(reader, headers):
            *lines, pending = (pending + piece).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = f"stream error: {chunk['error'].get('message', chunk['error'])}"
                    return
                _take_usage(result, chunk)
                choices = chunk.get("choices")
                if not choices:
                    continue
                result.num_chunks += 1
                if choices[0].get("text") and math.isnan(result.ttft):
                    result.ttft = time.perf_counter() - start
                if choices[0].get("finish_reason"):
                    result.finish_reason = choices[0]["finish_reason"]
    finally:
        writer.close()


async def _one(host: str, port: int, payload: bytes, stream: bool, start: float, timeout: float) -> RequestResult:
    result = RequestResult()
    try:
        await asyncio.wait_for(_exchange(host, port, payload, stream, start, result), timeout)
    except Exception as exc:  # counted per request; the burst goes on
        result.error = result.error or f"{type(exc).__name__}: {exc}"
    result.e2e = time.perf_counter() - start
    return result


async def _burst(url: str, payloads: list[bytes], stream: bool, timeout: float) -> BurstResult:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    cpu0, start = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*(_one(host, port, p, stream, start, timeout) for p in payloads))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return BurstResult(list(results), wall, cpu)


def send_burst(url: str, payloads: list[bytes], stream: bool, timeout: float = 600.0) -> BurstResult:
    """Send every payload at once to `url`/v1/completions; one result per payload, in order."""
    if urlsplit(url).scheme != "http":
        raise ValueError(f"the burst client speaks plain http only, got {url!r}")
    return asyncio.run(_burst(url, payloads, stream, timeout))
