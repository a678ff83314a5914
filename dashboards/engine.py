"""Engine board: load, latency, throughput, the KV cache and the engine's current settings."""

from __future__ import annotations

from .common import ANY_IS_BAD, GPU, HC, HM, HOST, MODEL, SLO_CLASS, H
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


def _ttft_rate(result: str = "") -> str:
    match = f', result="{result}"' if result else ""
    return f'sum by (slo_class) (rate(inferd_slo_requests_total{{{HC}, target="ttft"{match}}}[$__rate_interval]))'


slo = Row(
    "SLO classes",
    (
        Panel(
            "TTFT attainment by class",
            "Share of each class's finished requests that met its TTFT target (inferd_slo_requests_total), "
            "against the objective the burn-rate alerts use (inferd_slo:ttft_objective, alerts/params.yml).",
            "percentunit",
            (
                Query(f"{_ttft_rate('met')} / {_ttft_rate()}", "{{slo_class}}"),
                Query("max(inferd_slo:ttft_objective)", "objective"),
            ),
            thresholds=(Threshold(None, "red"), Threshold(0.95, "orange"), Threshold(0.99, "green")),
            min=0,
            max=1,
            requires="slo-classes",
        ),
        Panel(
            "Goodput by class",
            "Requests per second that met their class's TTFT target: the rate operators are judged on. "
            "Against the class's offered load (met + missed + shed) it shows what the engine serves in time.",
            "reqps",
            (Query(_ttft_rate("met"), "{{slo_class}}"),),
            stacked=True,
            requires="slo-classes",
        ),
        Panel(
            "Shed requests by class and reason",
            "Requests refused at admission per second (inferd_slo_requests_shed_total): slo_unattainable is "
            "the 429 for a deadline predicted past its margin, max_num_queued_reqs / max_num_queued_tokens the "
            "503 queue_full; demoted: on_miss=demote requests served as best effort instead. Below saturation "
            "this stays at 0.",
            "reqps",
            (
                Query(
                    f"sum by (slo_class, reason) (rate(inferd_slo_requests_shed_total{{{HC}}}[$__rate_interval]))",
                    "{{slo_class}} {{reason}}",
                ),
                Query(
                    f"sum by (slo_class) (rate(inferd_slo_requests_demoted_total{{{HC}}}[$__rate_interval]))",
                    "{{slo_class}} demoted",
                ),
            ),
            thresholds=ANY_IS_BAD,
        ),
        Panel(
            "p99 time to first token by class",
            "p99 TTFT of each class's finished requests (inferd_slo_time_to_first_token_seconds, buckets 5 ms to "
            "30 min); compare with the class's target (inferd_slo_class_target_seconds). Without classes every "
            "request is in class default.",
            "s",
            (
                Query(
                    "histogram_quantile(0.99, sum by (slo_class, le) "
                    f"(rate(inferd_slo_time_to_first_token_seconds_bucket{{{HC}}}[$__rate_interval])))",
                    "{{slo_class}}",
                ),
            ),
            thresholds=LATENCY,
        ),
        Panel(
            "TTFT prediction error by class",
            "p99 of admission's predicted minus actual TTFT (inferd_slo_ttft_prediction_error_seconds), by "
            "sign: under (the prediction came early) admits requests that then miss; over refuses or demotes "
            "requests that could have made it.",
            "s",
            (
                Query(
                    "histogram_quantile(0.99, sum by (slo_class, direction, le) "
                    f"(rate(inferd_slo_ttft_prediction_error_seconds_bucket{{{HC}}}[$__rate_interval])))",
                    "{{slo_class}} {{direction}}",
                ),
            ),
            width=24,
            requires="slo-classes",
        ),
    ),
)

BOARD = Board(
    uid="inferd-engine",
    title="inferd / Engine",
    description="The inference engine: load, latency, throughput, KV cache paging and the current mode and tunables.",
    rows=(load, latency, slo, kv, settings),
    variables=(HOST, GPU, MODEL, SLO_CLASS),
)
