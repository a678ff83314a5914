"""One streaming completion of `inferd bench serve`, timed into a RequestRecord.

Assumes only what any OpenAI-compatible server does: `POST /v1/completions` with
`stream: true`, server-sent `data:` lines, `[DONE]`. `usage` (asked with
`stream_options.include_usage`) gives the output token count where the server sends
it; else each chunk carrying a choice counts as one token.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from .datasets import SampleRequest
from .goodput import RequestRecord


def completion_body(
    model: str, sample: SampleRequest, sampling: dict[str, Any], slo_class: str | None = None
) -> dict[str, Any]:
    """`sampling`: the request's sampling fields; `slo_class`: sent only when given
    (`--send-slo-class`), so servers that do not know the field never see it."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": sample.prompt,
        "max_tokens": sample.output_len,
        "temperature": 0.0,
        **sampling,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if slo_class is not None:
        body["slo_class"] = slo_class
    return body


def plain_sampling(params: dict[str, Any]) -> dict[str, Any]:
    """SamplingMix's fields less those at their off value (top_k 0, min_p 0, top_p 1),
    so a greedy or temperature-only request carries only OpenAI's own fields."""
    off = {"top_k": 0, "min_p": 0.0, "top_p": 1.0}
    return {k: v for k, v in params.items() if not (k in off and v == off[k])}


async def send(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], record: RequestRecord, timeout: float
) -> None:
    start = time.perf_counter()
    last = None
    chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
            record.status = response.status_code
            if response.status_code != 200:
                record.e2e = time.perf_counter() - start  # how fast the refusal came
                text = (await response.aread())[:200].decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk["error"]
                    record.error = f"stream error: {error.get('message', error) if isinstance(error, dict) else error}"
                    break
                if chunk.get("usage"):
                    record.num_output_tokens = chunk["usage"].get("completion_tokens", 0)
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                if last is None:
                    record.ttft = now - start
                else:
                    record.itls.append(now - last)
                last = now
                chunks += 1
    except Exception as exc:  # counted as failed; the level goes on
        record.error = f"{type(exc).__name__}: {exc}"
    record.e2e = time.perf_counter() - start
    if last is None and not record.error:
        record.error = "the stream carried no token"
    if not record.num_output_tokens:
        record.num_output_tokens = chunks
