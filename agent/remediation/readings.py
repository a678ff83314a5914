"""What the policy reads from Prometheus: a rule's target before and after a step, the
demand on the engine and the guard beside it, the facts its planners use, and whether an
alert still fires. Every query is PromQL built from the rule, the alert's labels and the
PolicyConfig; no reading is taken without a metrics source."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from inferd.agent.remediation_rules import Facts, PolicyConfig, Rule

if TYPE_CHECKING:
    from .alerts import Alert


class MetricQuery(Protocol):
    """Instant queries (agent.prometheus.PrometheusClient)."""

    def samples(self, query: str) -> list[float] | None: ...

    def value(self, query: str) -> float | None: ...


class Readings:
    def __init__(self, metrics: MetricQuery | None, config: PolicyConfig):
        self.metrics = metrics
        self._config = config

    @property
    def available(self) -> bool:
        return self.metrics is not None

    @property
    def window(self) -> str:
        # The second half of the verification window: a change settles first (lowering
        # max_num_seqs preempts sequences, a burst of faults that is no verdict on it).
        return f"{max(1, round(self._config.verify_window_s / 2))}s"

    def selector(self, alert: Alert) -> str:
        sel = ",".join(f'{k}="{alert.labels[k]}"' for k in ("job", "instance") if alert.labels.get(k))
        return sel or self._config.engine_selector  # an empty selector is not valid PromQL

    def target_query(self, rule: Rule, alert: Alert) -> str | None:
        if not rule.target:
            return None
        return rule.target.format(sel=self.selector(alert), engine=self._config.engine_selector, window=self.window)

    def samples(self, query: str) -> list[float] | None:
        """Sample values ([] when none), or None when the query itself failed."""
        metrics = self.metrics
        assert metrics is not None  # callers query only with a metrics source
        return metrics.samples(query)

    def demand(self) -> float | None:
        if self.metrics is None:
            return None
        return self.metrics.value(self._config.demand_query.format(engine=self._config.engine_selector))

    def noise(self, query: str) -> float | None:
        """The target's standard deviation over the window before a step."""
        if self.metrics is None:
            return None
        return self.metrics.value(f"stddev_over_time(({query})[{self.window}:])")

    def guard(self) -> float | None:
        if self.metrics is None or not self._config.guard_query:
            return None
        return self.metrics.value(
            self._config.guard_query.format(engine=self._config.engine_selector, window=self.window)
        )

    def facts(self, alert: Alert, rule: Rule) -> Facts:
        if self.metrics is None:
            return Facts()
        sel = self.selector(alert) if rule.labels_name_engine else self._config.engine_selector
        return Facts(
            kv_usage=self.metrics.value(f"max(vllm:kv_cache_usage_perc{{{sel}}})"),
            waiting=self.metrics.value(f"sum(vllm:num_requests_waiting{{{sel}}})"),
            running=self.metrics.value(f"sum(vllm:num_requests_running{{{sel}}})"),
            preemptions_per_s=self.metrics.value(f"sum(rate(vllm:num_preemptions_total{{{sel}}}[{self.window}]))"),
            swap_time_share=self.metrics.value(f"sum(rate(inferd_kv_swap_seconds_total{{{sel}}}[{self.window}]))"),
            prompt_tokens=self.metrics.value(
                f"sum(rate(vllm:request_prompt_tokens_sum{{{sel}}}[{self.window}]))"
                f" / sum(rate(vllm:request_prompt_tokens_count{{{sel}}}[{self.window}]))"
            ),
        )

    def alert_firing(self, alert: Alert) -> bool | None:
        """Whether Prometheus' ALERTS series has the alert firing; None when it cannot say."""
        if self.metrics is None:
            return None
        labels = "".join(f',{k}="{alert.labels[k]}"' for k in ("job", "instance") if alert.labels.get(k))
        samples = self.metrics.samples(f'ALERTS{{alertname="{alert.name}",alertstate="firing"{labels}}}')
        return None if samples is None else bool(samples)
