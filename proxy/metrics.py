"""Prometheus metrics of one app, in its own registry.

Each app owns a `CollectorRegistry` (tests build many apps in one process; the global default
registry would refuse the second). Subclass `Metrics` or add collectors to `registry` to extend
it; `render()` serves whatever the registry holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from proxy.traffic import Traffic

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
_LAG_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # What every request updates: plain numbers, read when scraped (see proxy.traffic).
        self.traffic = Traffic(_LATENCY_BUCKETS)
        r.register(self.traffic)
        self.upstream_errors = Counter(
            "compaction_proxy_upstream_errors",
            "Upstream failures: connect, timeout (before headers), stream_cut, stream_timeout.",
            ("kind",),
            registry=r,
        )
        self.client_disconnects = Counter(
            "compaction_proxy_client_disconnects",
            "Clients that went away before their response was complete.",
            ("route",),
            registry=r,
        )

        self.loop_lag = Histogram(
            "compaction_proxy_event_loop_lag_seconds",
            "How late the event loop woke a timer (sampled every 50 ms): how long any request "
            "may have waited behind work on the loop.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )

        self.compaction = CompactionMetrics(r)
        self.state = StateMetrics(r)

    def render(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))


class _WithoutCreated:
    """`registry` without the `*_created` series prometheus-client adds to every counter and
    histogram: a start timestamp per label set that doubles the output and that Prometheus does
    not use. (prometheus_client.disable_created_metrics() would do it for the whole process.)"""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


class Children:
    """A labelled metric's children, kept by their label values (a small fixed set). Its
    `labels()` checks the values and takes a lock on every call, about 1.5 µs: a visible cost
    for the counters that every long request on the hooked routes bumps."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class CompactionMetrics:
    """What the compacting hook did: decisions, compactions, reuse, summarizer health."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter(
            "compaction_proxy_chat_decisions",
            "Parsed requests by outcome (none, applied, reused, failed) and dialect (chat, "
            "responses, anthropic).",
            ("status", "dialect"),
            registry=r,
        )
        self.recognized = Counter(
            "compaction_proxy_recognized_requests",
            "Requests recognized as the continuation of their conversation's last one, by who "
            "decided (known: from what is remembered; full: the full path) and dialect.",
            ("decision", "dialect"),
            registry=r,
        )
        self.decided = Children(self.decisions)
        """`decided(status, dialect).inc()`: counts one decision."""
        self.recognized_by = Children(self.recognized)
        """`recognized_by(decision, dialect).inc()`: counts one recognized request."""
        self.compactions = Counter(
            "compaction_proxy_compactions",
            "Compactions run, by reason (trigger, precompute, overflow) and path (llm, "
            "extractive, dropped, unchanged) and dialect.",
            ("reason", "path", "dialect"),
            registry=r,
        )
        self.checkpoint_hits = Counter(
            "compaction_proxy_checkpoint_hits",
            "Requests served by substituting a remembered checkpoint, without summarizing.",
            registry=r,
        )
        self.summarizer_seconds = Histogram(
            "compaction_proxy_summarizer_seconds",
            "Duration of compactions that called the summarizer (summary and memory together).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.summarizer_failures = Counter(
            "compaction_proxy_summarizer_failures",
            "Compactions whose summarizer call failed and fell back to a summary built by code.",
            registry=r,
        )
        self.summary_timeouts = Counter(
            "compaction_proxy_summary_wait_timeouts",
            "Requests that stopped waiting for a summary after compaction.summary_timeout_s.",
            registry=r,
        )
        self.cooldown_skips = Counter(
            "compaction_proxy_summarizer_cooldown_skips",
            "Compactions that skipped the summarizer because it is cooling down.",
            registry=r,
        )
        self.overflow_retries = Counter(
            "compaction_proxy_overflow_retries",
            "Context-length errors from the upstream answered by compacting and retrying once.",
            registry=r,
        )
        self.tokens_saved = Counter(
            "compaction_proxy_tokens_saved",
            "Estimated prompt tokens removed by compactions (each compaction counted once).",
            registry=r,
        )
        self.errors = Counter(
            "compaction_proxy_compaction_errors",
            "Internal errors in the compacting hook (the original request was forwarded).",
            registry=r,
        )


class StateMetrics:
    """The state backend's health (proxy.compacting.stores.guard): it never fails a request,
    so an outage shows here and in one log line."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.errors = Counter(
            "compaction_proxy_state_errors",
            "State backend operations that failed or timed out and were served in-process.",
            ("backend", "operation"),
            registry=r,
        )
        self.outages = Counter(
            "compaction_proxy_state_outages",
            "Times the state backend went from up to down.",
            ("backend",),
            registry=r,
        )
        self.files_replaced = Counter(
            "compaction_proxy_state_files_replaced",
            "State files started afresh: `vanished` (deleted or moved while in use; its rows"
            " copied into the new one) or `corrupt` (moved aside under a timestamped name).",
            ("reason",),
            registry=r,
        )
        self.degraded = Gauge(
            "compaction_proxy_state_degraded",
            "1 while the state backend is down and the in-process cache stands in for it.",
            ("backend",),
            registry=r,
        )
