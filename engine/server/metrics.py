"""The engine's metrics: vLLM V1 names where vLLM has the quantity, `inferd_*` otherwise.

Names, types, labels (`model_name`, `engine`) and buckets follow vLLM's
`vllm/v1/metrics/loggers.py`, so vLLM's Grafana boards and autoscalers read them
unchanged; docs/METRICS.md is the contract.

Two halves, one private registry:
- `StatLogger.record(step)` runs in the engine thread after each step and feeds the
  histograms (thread-safe prometheus_client objects).
- `SnapshotCollector` turns the engine's latest `EngineSnapshot` (a copy taken under a
  lock in the engine thread) into gauges and counters at scrape time; the scrape never
  touches engine internals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import KV_COLD_DTYPES, MODES, PREEMPTION_MODES
from ..request.slo import SloClasses
from ..stats import StepStats
from .slo_metrics import SloLogger
from .snapshot import EngineSnapshot

LABELS = ["model_name", "engine"]
FINISH_REASONS = ("stop", "length", "abort")

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
REQUEST_LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
STEP_DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
BATCH_SIZE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class StatLogger:
    """Histograms fed from the engine thread, one `record` per step."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int, engine_index: int = 0):
        labels = (model_name, str(engine_index))

        def hist(name: str, doc: str, buckets, labelnames=LABELS, values=labels):
            h = Histogram(name, doc, labelnames=labelnames, buckets=buckets, registry=registry)
            return h.labels(*values) if values else h

        tokens = build_1_2_5_buckets(max_model_len)
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.prefill_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        self.generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.max_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20])
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS
        )
        self.step_duration = hist(
            "inferd_scheduler_step_duration_seconds",
            "Duration of one engine step (schedule, swap, forward, sample).",
            STEP_DURATION_BUCKETS,
            labelnames=(),
            values=(),
        )
        self.batch_size = hist(
            "inferd_scheduler_batch_size",
            "Sequences scheduled in one engine step.",
            BATCH_SIZE_BUCKETS,
            labelnames=(),
            values=(),
        )

    def record(self, step: StepStats | None) -> None:
        if step is None:
            return
        self.step_duration.observe(step.duration)
        if step.batch_size:
            self.batch_size.observe(step.batch_size)
            self.iteration_tokens.observe(step.num_prompt_tokens + step.num_generation_tokens)
        for t in step.time_to_first_tokens:
            self.ttft.observe(t)
        for t in step.inter_token_latencies:
            self.itl.observe(t)
        for f in step.finished:
            self.e2e.observe(f.e2e_latency)
            self.queue.observe(f.queue_time)
            self.prefill.observe(f.prefill_time)
            self.decode.observe(f.decode_time)
            self.inference.observe(f.prefill_time + f.decode_time)
            self.prompt_tokens.observe(f.num_prompt_tokens)
            self.prefill_kv_computed.observe(f.num_prompt_tokens - max(f.num_cached_tokens, 0))
            self.generation_tokens.observe(f.num_generation_tokens)
            if f.num_generation_tokens > 1:
                self.tpot.observe(f.decode_time / (f.num_generation_tokens - 1))

    def record_request(self, n: int, max_tokens: int, max_num_generation_tokens: int) -> None:
        """Per-request parameters, recorded when a request finishes normally."""
        self.params_n.observe(n)
        self.params_max_tokens.observe(max_tokens)
        self.max_generation_tokens.observe(max_num_generation_tokens)


def cache_config_labels(config) -> dict[str, str]:
    """The static half of vLLM's `vllm:cache_config_info` labels, from an EngineConfig, with
    vLLM's spelling of values (Python reprs: "True", "0.9"; swap_space in GiB)."""
    return {
        "block_size": str(config.block_size),
        "cache_dtype": "auto",
        "calculate_kv_scales": "False",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": str(bool(config.enable_prefix_caching)),
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "is_attention_free": "False",
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "swap_space": f"{config.swap_space_bytes / 2**30:g}",
        "kv_cold_dtype": config.kv_cold_dtype,
    }


class SnapshotCollector(Collector):
    """Gauges and cumulative counters from the engine's latest snapshot."""

    def __init__(
        self,
        snapshot: Callable[[], EngineSnapshot],
        model_name: str,
        engine_index: int = 0,
        cache_labels: dict[str, str] | None = None,
    ):
        self._snapshot = snapshot
        self._labels = [model_name, str(engine_index)]
        self._cache_labels = cache_labels

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        s = self._snapshot()
        lv = self._labels

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(lv, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(lv, value)
            return c

        c = s.counters
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason (capacity: no room in the KV cache or batch; deferred: never here).",
            labels=LABELS + ["reason"],
        )
        by_reason.add_metric(lv + ["capacity"], s.num_waiting)
        by_reason.add_metric(lv + ["deferred"], 0)
        yield by_reason
        sleep = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 1 means the engine is awake (this engine never sleeps).",
            labels=LABELS + ["sleep_state"],
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.add_metric(lv + [state], value)
        yield sleep
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv.usage)
        if self._cache_labels is not None and s.kv.num_blocks:  # the pool's size is known once the core is up
            labels = {
                **self._cache_labels,
                "num_gpu_blocks": str(s.kv.num_blocks),
                "num_cpu_blocks": str(s.kv.num_host_blocks),
                "swap_space": f"{s.tunables.get('swap_space_bytes', 0) / 2**30:g}",
                "kv_cold_dtype": str(s.tunables.get("kv_cold_dtype", self._cache_labels["kv_cold_dtype"])),
            }
            info = GaugeMetricFamily(
                "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=LABELS + sorted(labels)
            )
            info.add_metric(lv + [labels[k] for k in sorted(labels)], 1.0)
            yield info
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", c.prefix_queries
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", c.prefix_hits
        )
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", c.num_preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens)
        # Prompt tokens by where their KV came from. Prefix hits are counted at admission,
        # so a request re-admitted after recompute may hit again; the split is capped.
        cached = min(c.prefix_hits, c.prompt_tokens)
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", labels=LABELS + ["source"]
        )
        by_source.add_metric(lv + ["local_compute"], c.prompt_tokens - cached)
        by_source.add_metric(lv + ["local_cache_hit"], cached)
        by_source.add_metric(lv + ["external_kv_transfer"], 0)
        yield by_source
        yield counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local prefix cache hits).", cached)
        # No external KV connector and no multimodal cache: their counters stay at 0 so
        # vLLM's boards show 0 rather than "no data".
        yield counter("vllm:external_prefix_cache_queries", "External prefix cache queries (no connector: 0).", 0)
        yield counter("vllm:external_prefix_cache_hits", "External prefix cache hits (no connector: 0).", 0)
        yield counter("vllm:mm_cache_queries", "Multi-modal cache queries (text-only engine: 0).", 0)
        yield counter("vllm:mm_cache_hits", "Multi-modal cache hits (text-only engine: 0).", 0)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=LABELS + ["finished_reason"]
        )
        for reason in FINISH_REASONS:
            success.add_metric(lv + [reason], c.requests_finished.get(reason, 0))
        yield success

        faults = CounterMetricFamily(
            "inferd_kv_page_faults",
            "KV page faults: blocks brought back by swap-in or sequences resumed by recomputation.",
            labels=["kind"],
        )
        faults.add_metric(["swap_in"], c.swap_in_faults)
        faults.add_metric(["recompute"], c.recompute_faults)
        yield faults
        swap = CounterMetricFamily(
            "inferd_kv_swap_bytes",
            "KV bytes copied between device and host swap pool (in = host to device).",
            labels=["direction"],
        )
        swap.add_metric(["in"], c.swap_in_bytes)
        swap.add_metric(["out"], c.swap_out_bytes)
        yield swap
        yield CounterMetricFamily(
            "inferd_kv_swap_seconds",
            "Wall time engine steps spent copying KV between device and host swap pool (the step waits for it).",
            value=c.swap_seconds,
        )
        blocks = GaugeMetricFamily(
            "inferd_kv_blocks",
            "KV cache blocks by state (cached blocks are free blocks still holding a reusable prefix).",
            labels=["state"],
        )
        blocks.add_metric(["used"], s.kv.num_used)
        blocks.add_metric(["free"], s.kv.num_free)
        blocks.add_metric(["cached"], s.kv.num_cached)
        yield blocks
        # Swapped-out sequences hold host blocks until they come back or finish: a count that
        # stays up with nothing swapped is a leak.
        host_blocks = GaugeMetricFamily(
            "inferd_kv_swap_pool_blocks",
            "Host swap pool blocks by state (used: holding swapped-out sequences' KV).",
            labels=["state"],
        )
        host_blocks.add_metric(["used"], s.kv.num_host_blocks - s.kv.num_host_free)
        host_blocks.add_metric(["free"], s.kv.num_host_free)
        yield host_blocks
        yield GaugeMetricFamily(
            "inferd_kv_fragmentation_ratio",
            "Share of allocated KV slots holding no token: the unfilled tails of running sequences' last blocks.",
            value=s.kv.fragmentation_ratio,
        )
        failures = CounterMetricFamily(
            "inferd_engine_fastpath_failures",
            "Fast-path failures; each one switched the engine to fallback.",
            labels=["reason"],
        )
        for reason, count in sorted(c.fastpath_failures.items()):
            failures.add_metric([reason], count)
        yield failures
        launch_errors = CounterMetricFamily(
            "inferd_engine_fastpath_launch_errors",
            "Steps that met a bug in the fast path's launch code and ran on the portable path; the mode stays.",
            labels=["reason"],
        )
        for reason, count in sorted(c.fastpath_launch_errors.items()):
            launch_errors.add_metric([reason], count)
        yield launch_errors

        by_dtype = GaugeMetricFamily(
            "inferd_kv_blocks_by_dtype",
            "Live KV blocks by storage: hot (full precision) or cold (int8, int4).",
            labels=["dtype"],
        )
        for dtype in ("hot", "int8", "int4"):
            by_dtype.add_metric([dtype], s.kv.blocks_by_dtype.get(dtype, 0))
        yield by_dtype
        yield GaugeMetricFamily(
            "inferd_kv_cold_bytes_saved",
            "KV bytes the live cold blocks save against full precision.",
            value=s.kv.bytes_saved,
        )
        quantized = CounterMetricFamily(
            "inferd_kv_quantized_blocks", "KV blocks quantized when they left the hot window.", labels=["dtype"]
        )
        for dtype in ("int8", "int4"):
            quantized.add_metric([dtype], c.quantized_blocks.get(dtype, 0))
        yield quantized
        yield CounterMetricFamily(
            "inferd_kv_quantize_seconds", "Time spent quantizing KV blocks.", value=c.quantize_seconds
        )
        yield CounterMetricFamily(
            "inferd_engine_decode_steps_launched_ahead",
            "Decode steps launched before the previous step's tokens were read (async "
            "scheduling: the host's output work overlaps the GPU).",
            value=c.decode_steps_launched_ahead,
        )
        yield CounterMetricFamily(
            "inferd_engine_decode_seconds",
            "Wall time of pure decode steps.",
            value=c.decode_seconds,
        )
        yield CounterMetricFamily(
            "inferd_engine_decode_bytes_read",
            "Bytes pure decode steps must read: every weight once a step and each sequence's KV "
            "context at full precision (over decode seconds: the decode memory bandwidth).",
            value=c.decode_bytes_read,
        )
        yield GaugeMetricFamily(
            "inferd_engine_cuda_graphs_captured",
            "CUDA graphs the fast path holds: decode steps and prefill chunks in packs (0 without it).",
            value=c.cuda_graphs_captured,
        )

        tunable = GaugeMetricFamily(
            "inferd_engine_tunable", "Current value of each numeric tunable engine parameter.", labels=["param"]
        )
        for name, value in s.tunables.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                tunable.add_metric([name], value)
        yield tunable
        yield _one_hot("inferd_engine_mode", "1 for the engine's current mode.", "mode", MODES, s.tunables["mode"])
        yield _one_hot(
            "inferd_engine_preemption_mode",
            "1 for the current preemption mode.",
            "mode",
            PREEMPTION_MODES,
            s.tunables["preemption_mode"],
        )
        yield _one_hot(
            "inferd_engine_kv_cold_dtype",
            "1 for the current cold-KV dtype.",
            "dtype",
            KV_COLD_DTYPES,
            s.tunables["kv_cold_dtype"],
        )


def _one_hot(name: str, doc: str, label: str, values: tuple, current: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=[label])
    for v in values:
        g.add_metric([v], 1.0 if v == current else 0.0)
    return g


class HttpMetrics:
    """http_requests_total{handler, method, status="2xx"...} and
    http_request_duration_seconds{handler, method}, as prometheus-fastapi-instrumentator
    exports them for vLLM (the overview board's error-rate and per-handler latency panels
    read them). For streams the duration runs to the end of the stream."""

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "http_requests_total",
            "Total number of requests by method, status and handler.",
            ["handler", "method", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "Duration of HTTP requests in seconds.",
            ["handler", "method"],
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )

    def observe(self, handler: str, method: str, status_code: int, seconds: float = 0.0) -> None:
        self.requests.labels(handler, method, f"{status_code // 100}xx").inc()
        self.duration.labels(handler, method).observe(seconds)


class ServerMetrics:
    """Everything /metrics serves, on a private registry (no process-global state)."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        snapshot: Callable[[], EngineSnapshot],
        cache_labels: dict[str, str] | None = None,
        slo_classes: SloClasses | None = None,
    ):
        self.registry = CollectorRegistry(auto_describe=False)
        # process_*, python_gc_* and python_info, which vLLM's /metrics carries from the
        # default registry: the API server process's CPU, memory and open files.
        for default in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(default)
        self.stats = StatLogger(self.registry, model_name, max_model_len)
        self.slo = SloLogger(self.registry, slo_classes if slo_classes is not None else SloClasses())
        self.http = HttpMetrics(self.registry)
        self.registry.register(SnapshotCollector(snapshot, model_name, cache_labels=cache_labels))
