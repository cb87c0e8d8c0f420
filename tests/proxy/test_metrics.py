"""The per-request series kept as plain numbers (proxy.metrics.RequestSeries) must read exactly
as the prometheus_client series they replace: same exposition lines."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from proxy.metrics import RequestSeries

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# On a bound, between bounds, past the last one, and zero.
LATENCIES = (0.005, 0.0051, 0.0, 0.3, 1.0, 11.0, 0.3, 0.049)


def _lines(registry: CollectorRegistry) -> set[str]:
    text = generate_latest(registry).decode()
    return {line for line in text.splitlines() if line and "_created" not in line}


def test_request_series_render_as_the_prometheus_client_series_they_replace() -> None:
    ours = CollectorRegistry()
    series = RequestSeries(BUCKETS)
    ours.register(series)

    theirs = CollectorRegistry()
    requests = Counter(
        "compaction_proxy_requests",
        "Requests answered, by route, method and status.",
        ("route", "method", "status"),
        registry=theirs,
    )
    latency = Histogram(
        "compaction_proxy_upstream_latency_seconds",
        "Time from sending a request upstream to receiving its response headers.",
        ("route",),
        buckets=BUCKETS,
        registry=theirs,
    )
    request_bytes = Counter(
        "compaction_proxy_request_bytes",
        "Request body bytes received from clients.",
        ("route",),
        registry=theirs,
    )
    response_bytes = Counter(
        "compaction_proxy_response_bytes",
        "Response body bytes relayed to clients.",
        ("route",),
        registry=theirs,
    )
    in_flight = Gauge(
        "compaction_proxy_in_flight_requests", "Requests being handled right now.", registry=theirs
    )

    for i, seconds in enumerate(LATENCIES):
        route = ("chat", "forward")[i % 2]
        status = (200, 404, 200)[i % 3]
        series.count_request(route, "POST", status)
        requests.labels(route, "POST", str(status)).inc()
        series.observe_upstream_latency(route, seconds)
        latency.labels(route).observe(seconds)
        series.add_request_bytes(route, 100 * i)
        request_bytes.labels(route).inc(100 * i)
        series.add_response_bytes(route, 7 * i)
        response_bytes.labels(route).inc(7 * i)
    series.in_flight += 3
    series.in_flight -= 1
    in_flight.inc(3)
    in_flight.dec()

    assert _lines(ours) == _lines(theirs)
    assert 'compaction_proxy_upstream_latency_seconds_bucket{le="+Inf",route="chat"} 4.0' in (
        _lines(ours)
    )


def test_made_up_methods_share_one_series() -> None:
    registry = CollectorRegistry()
    series = RequestSeries(BUCKETS)
    registry.register(series)
    for i in range(50):
        series.count_request("forward", f"M{i}", 405)
    series.count_request("forward", "GET", 200)
    lines = [line for line in _lines(registry) if line.startswith("compaction_proxy_requests_")]
    assert sorted(lines) == [
        'compaction_proxy_requests_total{method="GET",route="forward",status="200"} 1.0',
        'compaction_proxy_requests_total{method="other",route="forward",status="405"} 50.0',
    ]
