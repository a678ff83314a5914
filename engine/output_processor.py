"""Output processing: a step's sampled tokens become text, stop decisions,
`RequestOutput`s and finished-request statistics (vLLM V1's OutputProcessor).

The scheduler has appended the tokens to their sequences (Scheduler.update_from_output).
Per sampled token: record its logprobs and latencies, extend the text incrementally
(engine/text/detokenizer.py), and check, in this order, stop token ids, EOS, stop strings
(the text is cut before the match), then max_tokens / max_model_len. A sequence that
stops is finished by the scheduler (Scheduler.finish), which frees its blocks at once.
"""

from __future__ import annotations

from .request.outputs import CompletionOutput, RequestOutput
from .request.sequence import Request, Sequence, SequenceStatus
from .scheduling.scheduler import Scheduler
from .stats import EngineCounters, FinishedRequestStats, StepStats
from .text.tokenizer import Tokenizer


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, scheduler: Scheduler, counters: EngineCounters, max_model_len: int):
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.counters = counters
        self.max_model_len = max_model_len

    def process(
        self,
        requests: dict[str, Request],
        seqs: list[Sequence],
        tokens: list[int],
        logprobs: list[dict[int, float] | None],
        now: float,
        stats: StepStats,
    ) -> list[RequestOutput]:
        """Process one step's tokens (each already appended to its sequence); returns an
        output per request that got a token and drops the requests that finished from `requests`."""
        touched: dict[str, Request] = {}
        for seq, token, lp in zip(seqs, tokens, logprobs):
            req = requests[seq.request_id]
            self._append(req, seq, token, lp, now, stats)
            touched[seq.request_id] = req
        stats.num_generation_tokens += len(seqs)
        self.counters.generation_tokens += len(seqs)
        outputs = []
        for req in touched.values():
            finished = req.is_finished
            outputs.append(self._output(req, finished))
            if finished:
                self._record_finished(req, stats)
                del requests[req.request_id]
        return outputs

    def _append(
        self, req: Request, seq: Sequence, token: int, logprob: dict | None, now: float, stats: StepStats
    ) -> None:
        if logprob is not None:
            seq.logprobs.append(logprob)
        times = seq.times
        if times.first_token is None:
            times.first_token = now
            if seq.index == 0:
                stats.time_to_first_tokens.append(now - times.arrival)
                stats.first_token_request_ids.append(seq.request_id)
        elif times.last_token is not None:
            stats.inter_token_latencies.append(now - times.last_token)
        times.last_token = now
        if not req.counted_prompt:
            req.counted_prompt = True
            stats.num_prompt_tokens += len(req.prompt_token_ids)
            self.counters.prompt_tokens += len(req.prompt_token_ids)
        self._check_stop(seq, token, now)

    def _check_stop(self, seq: Sequence, token: int, now: float) -> None:
        p = seq.params
        prev_len = len(seq.output_text)
        seq.output_text = seq.detokenizer.update(self.tokenizer, seq.output_token_ids)
        num_output = len(seq.output_token_ids)
        if num_output >= p.min_tokens:
            if token in p.stop_token_ids:
                return self.scheduler.finish(seq, "stop", now, stop_reason=token)
            if not p.ignore_eos and token in self.tokenizer.eos_token_ids:
                return self.scheduler.finish(seq, "stop", now)
            if p.stop:
                window_start = max(0, prev_len - max(len(s) for s in p.stop))
                for stop in p.stop:
                    pos = seq.output_text.find(stop, window_start)
                    if pos >= 0:
                        seq.output_text = seq.output_text[:pos]
                        return self.scheduler.finish(seq, "stop", now, stop_reason=stop)
        if num_output >= p.max_tokens or len(seq.prompt_token_ids) + num_output >= self.max_model_len:
            self.scheduler.finish(seq, "length", now)

    def _output(self, req: Request, finished: bool) -> RequestOutput:
        # The server reads outputs on another thread while sequences grow: each output
        # gets the live lists and its length, and copies that prefix when first read.
        outs = []
        for s in req.seqs:
            # A finished sequence's lists no longer grow: handed over whole.
            num_tokens = None if s.status is SequenceStatus.FINISHED else len(s.output_token_ids)
            outs.append(
                CompletionOutput(
                    s.index,
                    s.output_text,
                    s.output_token_ids,
                    s.logprobs if s.params.logprobs is not None else None,
                    s.finish_reason,
                    s.stop_reason,
                    num_tokens,
                )
            )
        # Prompt tokens counted once per request, as in usage: the first sequence's prefix hits.
        cached = req.seqs[0].num_cached_tokens
        return RequestOutput(
            req.request_id, req.prompt, req.prompt_token_ids, outs, finished, cached, req.prompt_logprobs
        )

    def _record_finished(self, req: Request, stats: StepStats) -> None:
        first = req.seqs[0]
        t = first.times
        scheduled = t.first_scheduled or t.arrival
        first_token = t.first_token or scheduled
        finished = max(s.times.finished or first_token for s in req.seqs)
        stats.finished.append(
            FinishedRequestStats(
                finish_reason=first.finish_reason or "abort",
                num_prompt_tokens=len(req.prompt_token_ids),
                num_generation_tokens=sum(s.num_output_tokens for s in req.seqs),
                e2e_latency=finished - req.arrival_time,
                queue_time=scheduled - req.arrival_time,
                prefill_time=first_token - scheduled,
                decode_time=finished - first_token,
                num_cached_tokens=first.num_cached_tokens,
                request_id=req.request_id,
            )
        )
        self.counters.requests_finished[first.finish_reason or "abort"] += 1
