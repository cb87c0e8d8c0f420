"""Prometheus metrics of one app, in its own registry.

Each app owns a `CollectorRegistry` (tests build many apps in one process; the global default
registry would refuse the second). Subclass `Metrics` or add collectors to `registry` to extend
it; `render()` serves whatever the registry holds. The series every request updates are kept
as plain numbers (`RequestSeries`), the others are prometheus_client's own.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

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
        # What every request updates: plain numbers, read when scraped (see RequestSeries).
        self.requests = RequestSeries(_LATENCY_BUCKETS)
        r.register(self.requests)
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
        self.archive = ArchiveMetrics(r)
        self.recall = RecallMetrics(r)

    def render(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class _Histogram:
    """One label set's buckets: `counts[i]` values at most `bounds[i]`, the last `+Inf`."""

    __slots__ = ("counts", "total")

    def __init__(self, size: int) -> None:
        self.counts = [0] * (size + 1)
        self.total = 0.0


class RequestSeries:
    """The per-request series (requests, bytes each way, upstream latency, in flight) as plain
    numbers, turned into Prometheus samples only when `/metrics` is scraped: a collector
    (register it in a registry).

    prometheus_client's children take a lock and validate their argument on every update; at
    six updates per request that was a visible share of a pass-through request's CPU. These
    series are only ever updated on the event loop's thread, one update at a time, so a dict of
    floats is enough. The series keep their names, labels and types.
    """

    def __init__(self, latency_buckets: Sequence[float]) -> None:
        self.in_flight = 0
        self._bounds = tuple(latency_buckets)
        self._requests: defaultdict[tuple[str, str, str], float] = defaultdict(float)
        self._request_bytes: defaultdict[str, float] = defaultdict(float)
        self._response_bytes: defaultdict[str, float] = defaultdict(float)
        self._latency: dict[str, _Histogram] = {}

    def count_request(self, route: str, method: str, status: int) -> None:
        # A client may send any token as its method: one series per made-up method would let
        # it grow the exposition without bound.
        self._requests[route, method if method in _METHODS else "other", str(status)] += 1

    def add_request_bytes(self, route: str, size: int) -> None:
        self._request_bytes[route] += size

    def add_response_bytes(self, route: str, size: int) -> None:
        self._response_bytes[route] += size

    def observe_upstream_latency(self, route: str, seconds: float) -> None:
        histogram = self._latency.get(route)
        if histogram is None:
            histogram = self._latency[route] = _Histogram(len(self._bounds))
        histogram.counts[bisect.bisect_left(self._bounds, seconds)] += 1
        histogram.total += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "compaction_proxy_requests",
            "Requests answered, by route, method and status.",
            labels=("route", "method", "status"),
        )
        for labels, value in list(self._requests.items()):
            requests.add_metric(labels, value)
        yield requests
        yield self._latency_family()
        for name, doc, values in (
            ("request_bytes", "Request body bytes received from clients.", self._request_bytes),
            ("response_bytes", "Response body bytes relayed to clients.", self._response_bytes),
        ):
            family = CounterMetricFamily(f"compaction_proxy_{name}", doc, labels=("route",))
            for route, total in list(values.items()):
                family.add_metric((route,), total)
            yield family
        yield GaugeMetricFamily(
            "compaction_proxy_in_flight_requests",
            "Requests being handled right now.",
            value=self.in_flight,
        )

    def _latency_family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "compaction_proxy_upstream_latency_seconds",
            "Time from sending a request upstream to receiving its response headers.",
            labels=("route",),
        )
        edges = [floatToGoString(bound) for bound in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        for route, histogram in list(self._latency.items()):
            cumulative, running = [], 0
            for edge, count in zip(edges, histogram.counts, strict=True):
                running += count
                cumulative.append((edge, float(running)))
            family.add_metric((route,), cumulative, histogram.total)
        return family


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


M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """A labelled metric's children, kept by their label values (a small fixed set). Its
    `labels()` checks the values and takes a lock on every call, about 1.5 µs: a visible cost
    for the counters that every long request on the hooked routes bumps."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
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
            "Parsed requests by outcome (none, applied, reused, failed, shadow, skipped) and "
            "dialect (chat, responses, anthropic).",
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
        self.stepped_aside_total = Counter(
            "compaction_proxy_stepped_aside",
            "Requests forwarded as sent because their client or provider compacts for itself "
            "(status skipped), by reason (codex-compaction, codex-handoff, "
            "responses-context-management, anthropic-compaction, anthropic-compact-edit, "
            "claude-code-summary) and dialect.",
            ("reason", "dialect"),
            registry=r,
        )
        self.stepped_aside = Children(self.stepped_aside_total)
        """`stepped_aside(reason, dialect).inc()`: counts one request left alone."""
        self.recognized_by = Children(self.recognized)
        """`recognized_by(decision, dialect).inc()`: counts one recognized request."""
        self.compactions = Counter(
            "compaction_proxy_compactions",
            "Compactions run, by reason (trigger, precompute, overflow) and path (llm, "
            "extractive, dropped, selective, unchanged) and dialect.",
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
        self.recall_refused = Counter(
            "compaction_proxy_recall_refused",
            "Compacted requests the upstream refused (400) with the recall tool, retried once "
            "without it.",
            registry=r,
        )
        self.thinking_refused = Counter(
            "compaction_proxy_thinking_refused",
            "Compacted requests the upstream refused (400) for a thinking block bound to a "
            "changed prefix, retried once without the thinking of kept turns.",
            registry=r,
        )
        self.tokens_saved = Counter(
            "compaction_proxy_tokens_saved",
            "Estimated prompt tokens removed by compactions (each compaction counted once).",
            registry=r,
        )
        self.pinned_overflow = Counter(
            "compaction_proxy_pinned_overflow",
            "Standing instructions of the user that a compaction had no room for in the "
            "summary's pinned section (compaction.pinned_ratio): written to the memory file.",
            registry=r,
        )
        self.worker_replacements = Counter(
            "compaction_proxy_worker_replacements",
            "Worker pools replaced (proxy.compacting.background.workers), by reason: deadline "
            "(a worker missed a job's compaction.worker_timeout_s and was killed) or died.",
            ("reason",),
            registry=r,
        )
        self.errors = Counter(
            "compaction_proxy_compaction_errors",
            "Internal errors in the compacting hook (the original request was forwarded).",
            registry=r,
        )


class ArchiveMetrics:
    """The archive of folded turns (proxy.state.archive): what it kept, dropped and failed to keep.
    A write that fails never fails a request, so it shows here and in one log line."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.archived = Counter(
            "compaction_proxy_archive_messages",
            "Folded messages archived.",
            registry=r,
        )
        self.dropped = Counter(
            "compaction_proxy_archive_dropped",
            "Archived messages dropped by the bounds (size per session, age).",
            ("reason",),
            registry=r,
        )
        self.failures = Counter(
            "compaction_proxy_archive_failures",
            "Archive writes that failed (the request went on).",
            registry=r,
        )


class RecallMetrics:
    """The `recall` tool (proxy.recall): the rounds the proxy answered, what they cost upstream,
    the proxy's own time in them, and the rounds given up (the client got the response it would
    have got without recall)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.rounds = Counter(
            "compaction_proxy_recall_rounds",
            "Recall calls answered by the proxy, each followed by one more upstream call.",
            ("dialect",),
            registry=r,
        )
        self.tokens = Counter(
            "compaction_proxy_recall_tokens",
            "Tokens the upstream reported for recall rounds (kind: input, output).",
            ("kind",),
            registry=r,
        )
        self.given_up = Counter(
            "compaction_proxy_recall_given_up",
            "Recall rounds given up (reason: upstream_error, unreadable, max_rounds, error).",
            ("reason",),
            registry=r,
        )
        self.round_seconds = Histogram(
            "compaction_proxy_recall_round_seconds",
            "The proxy's own time in one recall round (search, answer, next body), upstream "
            "waits excluded.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )


class StateMetrics:
    """The state backend's health (proxy.state.guard): it never fails a request,
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
