"""The per-request series kept as plain numbers (proxy.traffic) and the lean access record
(proxy.logs) must read exactly as the prometheus_client series and the standard LogRecord they
replace: same exposition lines, same attributes for any formatter."""

from __future__ import annotations

import io
import logging
import threading

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from proxy.logs import JsonFormatter, RequestInfo, log_request
from proxy.traffic import Traffic

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# On a bound, between bounds, past the last one, and zero.
LATENCIES = (0.005, 0.0051, 0.0, 0.3, 1.0, 11.0, 0.3, 0.049)


def _lines(registry: CollectorRegistry) -> set[str]:
    text = generate_latest(registry).decode()
    return {line for line in text.splitlines() if line and "_created" not in line}


def test_traffic_renders_as_the_prometheus_client_series_it_replaces() -> None:
    ours = CollectorRegistry()
    traffic = Traffic(BUCKETS)
    ours.register(traffic)

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
        traffic.count_request(route, "POST", status)
        requests.labels(route, "POST", str(status)).inc()
        traffic.observe_upstream_latency(route, seconds)
        latency.labels(route).observe(seconds)
        traffic.add_request_bytes(route, 100 * i)
        request_bytes.labels(route).inc(100 * i)
        traffic.add_response_bytes(route, 7 * i)
        response_bytes.labels(route).inc(7 * i)
    traffic.in_flight += 3
    traffic.in_flight -= 1
    in_flight.inc(3)
    in_flight.dec()

    assert _lines(ours) == _lines(theirs)
    assert 'compaction_proxy_upstream_latency_seconds_bucket{le="+Inf",route="chat"} 4.0' in (
        _lines(ours)
    )


def test_the_access_record_carries_every_attribute_a_formatter_may_ask_for() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(levelno)d %(name)s %(pathname)s %(filename)s "
            "%(module)s %(lineno)d %(funcName)s %(process)d %(processName)s %(thread)d "
            "%(threadName)s %(relativeCreated)d %(msecs)d %(message)s %(method)s %(status)d"
        )
    )
    json_stream = io.StringIO()
    json_handler = logging.StreamHandler(json_stream)
    json_handler.setFormatter(JsonFormatter())
    access = logging.getLogger("proxy.access")
    access.addHandler(handler)
    access.addHandler(json_handler)
    previous = access.level
    access.setLevel(logging.INFO)
    try:
        info = RequestInfo(route="chat", session="s-1", upstream_status=200, outcome="complete")
        log_request("POST", "/v1/chat/completions", 200, info)
        # A loop run in another thread than the one that imported proxy.logs: its own thread.
        elsewhere = threading.Thread(
            target=log_request, args=("GET", "/healthz", 200, info), name="loop-thread"
        )
        elsewhere.start()
        elsewhere.join()
    finally:
        access.removeHandler(handler)
        access.removeHandler(json_handler)
        access.setLevel(previous)

    text, other = stream.getvalue().splitlines()
    assert f" {threading.get_ident()} MainThread " in text
    assert f" {elsewhere.ident} loop-thread " in other
    assert " INFO 20 proxy.access " in text
    assert "logs.py logs 0 log_request" in text
    assert text.rstrip().endswith("request POST 200")
    line = orjson.loads(json_stream.getvalue().splitlines()[0])
    assert line.pop("ts").endswith("Z")
    assert line == {
        "level": "INFO",
        "logger": "proxy.access",
        "msg": "request",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "duration_ms": line["duration_ms"],
        "session": "s-1",
        "route": "chat",
        "upstream_status": 200,
        "outcome": "complete",
    }


def test_made_up_methods_share_one_series() -> None:
    registry = CollectorRegistry()
    traffic = Traffic(BUCKETS)
    registry.register(traffic)
    for i in range(50):
        traffic.count_request("forward", f"M{i}", 405)
    traffic.count_request("forward", "GET", 200)
    lines = [line for line in _lines(registry) if line.startswith("compaction_proxy_requests_")]
    assert sorted(lines) == [
        'compaction_proxy_requests_total{method="GET",route="forward",status="200"} 1.0',
        'compaction_proxy_requests_total{method="other",route="forward",status="405"} 50.0',
    ]
