"""A job's outputs from the engine: one engine request per prompt, their cumulative outputs
merged as they come, the job counted in admission's queue until its first token.

A batch's prompts run as requests `<id>-0`, `<id>-1`, ...; one prompt runs as `<id>`.
Closing the generator (the client left, the stream ended) aborts what still runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from ..request.outputs import RequestOutput
from .admission import Admission
from .core_client import EngineCoreClient
from .job import Job, Prompt


async def job_outputs(
    engine: EngineCoreClient, admission: Admission, job: Job
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """(prompt index, cumulative output) from all of the job's prompts, as they come; the
    job counts in admission's queue until its first output."""
    deadline = job.slo.deadline if job.slo is not None else None
    ticket = admission.enter(job.priority, deadline, job.num_prompt_tokens, job.num_seqs)
    outputs = _engine_outputs(engine, job, lambda: admission.started(ticket))
    try:
        async for item in outputs:
            admission.started(ticket)
            yield item
    finally:
        admission.leave(ticket)
        await outputs.aclose()


async def final_outputs(engine: EngineCoreClient, admission: Admission, job: Job) -> list[RequestOutput]:
    """Each prompt's last output, in prompt order."""
    finals: dict[int, RequestOutput] = {}
    async for i, out in job_outputs(engine, admission, job):
        finals[i] = out
    return [finals[i] for i in range(len(job.prompts))]


async def _engine_outputs(
    engine: EngineCoreClient, job: Job, on_first_token: Callable[[], None]
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    if len(job.prompts) == 1:
        gen = _generate(engine, job, job.request_id, job.prompts[0], on_first_token)
        try:
            async for out in gen:
                yield 0, out
        finally:
            await gen.aclose()
        return
    merged: asyncio.Queue = asyncio.Queue()
    remaining = len(job.prompts)

    async def pump(i: int, p: Prompt) -> None:
        gen = _generate(engine, job, f"{job.request_id}-{i}", p, on_first_token)
        try:
            async for out in gen:
                await merged.put((i, out))
        except Exception as exc:
            await merged.put((i, exc))
        finally:
            await gen.aclose()
            await merged.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, p)) for i, p in enumerate(job.prompts)]
    try:
        while remaining:
            i, item = await merged.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _generate(
    engine: EngineCoreClient, job: Job, request_id: str, prompt: Prompt, on_first_token: Callable[[], None]
) -> AsyncGenerator[RequestOutput, None]:
    """One prompt of the job as one engine request."""
    return engine.generate(
        request_id,
        prompt.text,
        prompt.token_ids,
        job.params,
        job.priority,
        job.trace_headers,
        final_only=not job.stream,
        slo=job.slo,
        predicted_ttft_s=job.predicted_ttft_s,
        on_first_token=on_first_token,
    )
