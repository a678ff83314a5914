"""Engine board: load, latency, throughput, the KV cache and the engine's current settings."""

from __future__ import annotations

from .common import ANY_IS_BAD, GPU, HM, HOST, MODEL, H
from .spec import Board, Panel, Query, Row, Threshold

LATENCY = (Threshold(None, "green"), Threshold(1, "orange"), Threshold(5, "red"))
ITL = (Threshold(None, "green"), Threshold(0.1, "orange"), Threshold(0.5, "red"))


def _quantiles(metric: str) -> tuple[Query, ...]:
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{HM}}}[$__rate_interval])))",
            f"p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    )


load = Row(
    "Load",
    (
        Panel(
            "Requests running and waiting",
            "Requests in the running batch and in the waiting queue (vllm:num_requests_running / _waiting). "
            "A growing queue with a flat running count means the engine is at its concurrency limit.",
            "short",
            (
                Query(f"sum(vllm:num_requests_running{{{HM}}})", "running"),
                Query(f"sum(vllm:num_requests_waiting{{{HM}}})", "waiting"),
            ),
            headline=True,
        ),
        Panel(
            "Tokens per second",
            "Prompt tokens processed and tokens generated per second.",
            "suffix: tokens/s",
            (
                Query(f"sum(rate(vllm:prompt_tokens_total{{{HM}}}[$__rate_interval]))", "prompt (in)"),
                Query(f"sum(rate(vllm:generation_tokens_total{{{HM}}}[$__rate_interval]))", "generated (out)"),
            ),
            headline=True,
        ),
        Panel(
            "Finished requests",
            "Requests finished per second by reason: stop (end of sequence or stop string), length (max tokens), "
            "abort (client went away or error).",
            "reqps",
            (
                Query(
                    f"sum by (finished_reason) (rate(vllm:request_success_total{{{HM}}}[$__rate_interval]))",
                    "{{finished_reason}}",
                ),
            ),
            stacked=True,
        ),
        Panel(
            "Batch size",
            "Sequences per engine step, p50 and p99 (inferd_scheduler_batch_size).",
            "short",
            (
                Query(
                    f"histogram_quantile(0.5, sum by (le) (rate(inferd_scheduler_batch_size_bucket{{{H}}}[$__rate_interval])))",
                    "p50",
                ),
                Query(
                    f"histogram_quantile(0.99, sum by (le) (rate(inferd_scheduler_batch_size_bucket{{{H}}}[$__rate_interval])))",
                    "p99",
                ),
            ),
        ),
    ),
)

latency = Row(
    "Latency",
    (
        Panel(
            "Time to first token",
            "p50 and p99 of the time from a request's arrival to its first token (queueing plus prefill).",
            "s",
            _quantiles("vllm:time_to_first_token_seconds"),
            thresholds=LATENCY,
            headline=True,
            width=8,
        ),
        Panel(
            "Inter-token latency",
            "p50 and p99 of the time between consecutive output tokens of a request (decode step time seen by "
            "the client).",
            "s",
            _quantiles("vllm:inter_token_latency_seconds"),
            thresholds=ITL,
            headline=True,
            width=8,
        ),
        Panel(
            "End-to-end latency",
            "p50 and p99 of the time from a request's arrival to its last token.",
            "s",
            _quantiles("vllm:e2e_request_latency_seconds"),
            thresholds=(Threshold(None, "green"), Threshold(10, "orange"), Threshold(30, "red")),
            width=8,
        ),
        Panel(
            "Engine step duration",
            "p50 and p99 of one engine step (schedule, model forward, sample).",
            "s",
            (
                Query(
                    f"histogram_quantile(0.5, sum by (le) (rate(inferd_scheduler_step_duration_seconds_bucket{{{H}}}[$__rate_interval])))",
                    "p50",
                ),
                Query(
                    f"histogram_quantile(0.99, sum by (le) (rate(inferd_scheduler_step_duration_seconds_bucket{{{H}}}[$__rate_interval])))",
                    "p99",
                ),
            ),
            thresholds=ITL,
        ),
        Panel(
            "Time per request phase",
            "Mean seconds a request spends queued, in prefill and in decode.",
            "s",
            tuple(
                Query(
                    f"sum(rate(vllm:request_{phase}_time_seconds_sum{{{HM}}}[$__rate_interval]))"
                    f" / (sum(rate(vllm:request_{phase}_time_seconds_count{{{HM}}}[$__rate_interval])) > 0)",
                    phase,
                )
                for phase in ("queue", "prefill", "decode")
            ),
            stacked=True,
        ),
    ),
)

kv = Row(
    "KV cache",
    (
        Panel(
            "KV cache usage",
            "Used KV blocks over all blocks (vllm:kv_cache_usage_perc, 0..1). Near 1 new sequences wait or "
            "running ones are preempted.",
            "percentunit",
            (Query(f"max(vllm:kv_cache_usage_perc{{{HM}}})", "usage"),),
            thresholds=(Threshold(None, "green"), Threshold(0.9, "orange"), Threshold(0.98, "red")),
            min=0,
            max=1,
            headline=True,
        ),
        Panel(
            "KV blocks by state",
            "KV blocks used by running sequences, free, and cached (free but holding a reusable prefix).",
            "short",
            (Query(f"sum by (state) (inferd_kv_blocks{{{H}}})", "{{state}}"),),
            stacked=True,
        ),
        Panel(
            "KV page faults",
            "KV page faults per second by kind: swap_in (blocks brought back from the host swap pool) and "
            "recompute (blocks rebuilt by prefill after a preemption).",
            "suffix: faults/s",
            (Query(f"sum by (kind) (rate(inferd_kv_page_faults_total{{{H}}}[$__rate_interval]))", "{{kind}}"),),
            thresholds=(Threshold(None, "green"), Threshold(1, "orange"), Threshold(10, "red")),
            stacked=True,
            headline=True,
        ),
        Panel(
            "KV swap traffic",
            "Bytes per second moved between the GPU KV cache and the host swap pool (in = host to device).",
            "Bps",
            (
                Query(
                    f"sum by (direction) (rate(inferd_kv_swap_bytes_total{{{H}}}[$__rate_interval]))", "{{direction}}"
                ),
            ),
        ),
        Panel(
            "KV fragmentation",
            "Share of free KV memory that no waiting request can use (inferd_kv_fragmentation_ratio).",
            "percentunit",
            (Query(f"max(inferd_kv_fragmentation_ratio{{{H}}})", "fragmentation"),),
            thresholds=(Threshold(None, "green"), Threshold(0.2, "orange"), Threshold(0.4, "red")),
            min=0,
            max=1,
        ),
        Panel(
            "Prefix cache hit rate",
            "Prompt tokens found in the prefix cache over prompt tokens looked up.",
            "percentunit",
            (
                Query(
                    f"sum(rate(vllm:prefix_cache_hits_total{{{HM}}}[$__rate_interval]))"
                    f" / (sum(rate(vllm:prefix_cache_queries_total{{{HM}}}[$__rate_interval])) > 0)",
                    "hit rate",
                ),
            ),
            thresholds=(Threshold(None, "orange"), Threshold(0.2, "green")),
            min=0,
            max=1,
        ),
        Panel(
            "Preemptions",
            "Running sequences preempted per second to free KV blocks (vllm:num_preemptions_total).",
            "suffix: /s",
            (Query(f"sum(rate(vllm:num_preemptions_total{{{HM}}}[$__rate_interval]))", "preemptions"),),
            thresholds=ANY_IS_BAD,
        ),
    ),
)

settings = Row(
    "Mode and tunables",
    (
        Panel(
            "Engine mode",
            "The engine's attention path: fast (Triton/CUDA graphs) or fallback (portable eager path). The agent "
            "switches to fallback when the fast path fails.",
            "short",
            (Query(f"max by (mode) (inferd_engine_mode{{{H}}}) == 1", "{{mode}}"),),
            kind="state-timeline",
            thresholds=(Threshold(None, "green"),),
            width=8,
        ),
        Panel(
            "Preemption mode and cold KV dtype",
            "How preempted sequences are resumed (swap or recompute) and the dtype of cold KV blocks.",
            "short",
            (
                Query(f"max by (mode) (inferd_engine_preemption_mode{{{H}}}) == 1", "preemption {{mode}}"),
                Query(f"max by (dtype) (inferd_engine_kv_cold_dtype{{{H}}}) == 1", "cold KV {{dtype}}"),
            ),
            kind="state-timeline",
            thresholds=(Threshold(None, "blue"),),
            width=8,
        ),
        Panel(
            "Fast-path failures",
            "Fast-path failures per rate interval by reason; each switches the engine to fallback.",
            "short",
            (
                Query(
                    f"sum by (reason) (increase(inferd_engine_fastpath_failures_total{{{H}}}[$__rate_interval]))",
                    "{{reason}}",
                ),
            ),
            thresholds=ANY_IS_BAD,
            width=8,
            requires="fastpath",
        ),
        Panel(
            "Tunables",
            "Current value of each numeric tunable (max_num_seqs, max_num_batched_tokens, kv_hot_window, "
            "swap_space_bytes, ...); steps show the remediation loop at work.",
            "short",
            (Query(f"max by (param) (inferd_engine_tunable{{{H}}})", "{{param}}"),),
            width=12,
        ),
        Panel(
            "Engine up and restarts",
            "1 while the supervised engine answers (inferd_engine_up), and restarts per rate interval.",
            "short",
            (
                Query(f"max(inferd_engine_up{{{H}}})", "up"),
                Query(f"sum(increase(inferd_engine_restarts_total{{{H}}}[$__rate_interval]))", "restarts"),
            ),
            thresholds=(Threshold(None, "red"), Threshold(1, "green")),
            width=12,
        ),
    ),
)

BOARD = Board(
    uid="inferd-engine",
    title="inferd / Engine",
    description="The inference engine: load, latency, throughput, KV cache paging and the current mode and tunables.",
    rows=(load, latency, kv, settings),
    variables=(HOST, GPU, MODEL),
)
