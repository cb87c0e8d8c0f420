"""The per-request series (requests, bytes each way, upstream latency, in flight) as plain numbers,
turned into Prometheus samples only when `/metrics` is scraped.

prometheus_client's children take a lock and validate their argument on every update; at six
updates per request that was a visible share of a pass-through request's CPU. These series are
only ever updated on the event loop's thread, one update at a time, so a dict of floats is
enough. The series keep their names, labels and types.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class _Histogram:
    """One label set's buckets: `counts[i]` values at most `bounds[i]`, the last `+Inf`."""

    __slots__ = ("counts", "total")

    def __init__(self, size: int) -> None:
        self.counts = [0] * (size + 1)
        self.total = 0.0


class Traffic:
    """A Prometheus collector (register it in a registry) of what every request updates."""

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
