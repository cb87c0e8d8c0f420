"""The dashboard at /admin/ (docs/operations.md): a page, its script and style served from
package data (proxy/admin/static: nothing built, nothing from elsewhere), and the JSON it reads
under /admin/api/ (from the session records, proxy.admin.records), behind the same
`admin.token` as the admin endpoints.

The page asks for the token in a form and keeps it in the tab's sessionStorage; the script
sends it as `Authorization: Bearer` on each call, so it never appears in a URL or an access line.
The page itself holds no data and loads without the token.

- `/admin/api/sessions?sort=&order=&q=&offset=&limit=`: one page of session summaries (paged
  here, not in the browser) with the money saved at `models.prices`;
- `/admin/api/sessions/{session}`: its summary, timeline, compaction records (each a receipt with
  its diff), window and trigger;
- `/admin/api/sessions/{session}/memory`: the end of its memory file;
- `/admin/api/live`: figures read from the same collectors as /metrics.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.resources
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from compaction import MemoryWriter
from proxy.admin.records import SORTABLE
from proxy.admin.routes import require_admin
from proxy.errors import BadRequest, NotFound
from proxy.http import keys
from proxy.http.middleware import GET_ONLY
from proxy.metrics import Metrics
from proxy.sessions import check_session_id
from proxy.settings import ModelsSettings

MAX_PAGE = 500
MEMORY_TAIL_BYTES = 256 * 1024
_ASSETS = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
# The page runs only what the proxy served; nothing may frame it, nothing leaves by referrer.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


async def dashboard_page(request: web.Request) -> web.Response:
    _require_page(request)
    return web.Response(body=_asset("index.html"), content_type="text/html", headers=_PAGE_HEADERS)


async def dashboard_asset(request: web.Request) -> web.Response:
    _require_page(request)
    name = request.match_info["name"]
    if name not in _ASSETS:
        raise NotFound(f"no dashboard file {name!r}")
    return web.Response(body=_asset(name), content_type=_ASSETS[name], headers=_PAGE_HEADERS)


async def api_sessions(request: web.Request) -> web.Response:
    require_admin(request)
    query = request.rel_url.query
    sort = query.get("sort", "last_seen")
    if sort not in SORTABLE:
        raise BadRequest(f"sort must be one of {', '.join(sorted(SORTABLE))}")
    page = await request.app[keys.RECORDS].read_page(
        sort=sort,
        descending=query.get("order", "desc") != "asc",
        search=query.get("q", ""),
        offset=_bounded_int(query, "offset", 0, 0, 10**9),
        limit=_bounded_int(query, "limit", 50, 1, MAX_PAGE),
    )
    models = request.app[keys.SETTINGS].models
    for summary in page["sessions"]:
        summary.update(estimate_savings(models, summary["model"], summary["tokens_saved"]))
    return _json(page)


async def api_session(request: web.Request) -> web.Response:
    require_admin(request)
    session_id = check_session_id(request.match_info["session"], "the path")
    found = await request.app[keys.RECORDS].read_session(session_id)
    if found is None:
        raise NotFound(f"no session {session_id!r} seen (or it was evicted)")
    settings = request.app[keys.SETTINGS]
    window = found["window"] or settings.models.default_context_window
    found.update(estimate_savings(settings.models, found["model"], found["tokens_saved"]))
    found["window"] = window
    found["trigger"] = settings.compaction.trigger.at(window)
    return _json(found)


async def api_memory(request: web.Request) -> web.Response:
    require_admin(request)
    session_id = check_session_id(request.match_info["session"], "the path")
    settings = request.app[keys.SETTINGS]
    path = MemoryWriter(settings.memory.dir).path_for(session_id)
    text, size = await asyncio.to_thread(_read_tail, path, MEMORY_TAIL_BYTES)
    if settings.admin.preview_chars == 0:  # what conversations say stays out of /admin
        text = ""
    return _json({"session_id": session_id, "size": size, "text": text})


async def api_live(request: web.Request) -> web.Response:
    require_admin(request)
    app = request.app
    figures = read_live_figures(app[keys.METRICS])
    figures["in_flight"] -= 1  # this request, in flight while it answers
    figures["overhead_ms"] = app[keys.RECORDS].overhead_quantiles()
    # The watchers run for the app's whole life (proxy.app): not work that waits.
    figures["background_tasks"] = max(0, app[keys.TASKS].queued)
    return _json(figures)


def estimate_savings(models: ModelsSettings, model: str | None, tokens: int) -> dict[str, Any]:
    """The money `tokens` prompt tokens not sent would have cost: at the model's input price,
    and at its cached-input price (the least they would have cost)."""
    price = models.price_for(model)
    return {
        "money_saved": round(tokens * price.input / 1e6, 4),
        "money_saved_cached": round(tokens * price.cached_input / 1e6, 4),
    }


def read_live_figures(metrics: Metrics) -> dict[str, Any]:
    """Totals and quantiles from the collectors /metrics renders; requests per second is the
    reader's: the difference of two `requests` totals over the difference of their `time`s.
    The dashboard's own requests (routes named admin*) are left out, but from `in_flight`
    (the gauge has no route)."""
    requests = 0.0
    in_flight = 0.0
    latency: dict[float, float] = {}
    lag: dict[float, float] = {}
    degraded = 0.0
    state_errors = 0.0
    compactions = 0.0
    failures = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if labels.get("route", "").startswith("admin"):
                continue
            if name == "compaction_proxy_requests_total":
                requests += value
            elif name == "compaction_proxy_in_flight_requests":
                in_flight += value
            elif name == "compaction_proxy_upstream_latency_seconds_bucket":
                _add_bucket(latency, labels["le"], value)
            elif name == "compaction_proxy_event_loop_lag_seconds_bucket":
                _add_bucket(lag, labels["le"], value)
            elif name == "compaction_proxy_state_degraded":
                degraded += value
            elif name == "compaction_proxy_state_errors_total":
                state_errors += value
            elif name == "compaction_proxy_compactions_total":
                compactions += value
            elif name == "compaction_proxy_summarizer_failures_total":
                failures += value
    return {
        "time": asyncio.get_running_loop().time(),
        "requests": requests,
        "in_flight": in_flight,
        "upstream_latency_ms": _quantiles_ms(latency),
        "loop_lag_ms": _quantiles_ms(lag),
        "state": {"healthy": degraded == 0, "errors": state_errors},
        "compactions": compactions,
        "summarizer_failures": failures,
    }


def quantile_of_buckets(buckets: Mapping[float, float], q: float) -> float | None:
    """The `q` quantile of a cumulative histogram (upper bound -> count), interpolated linearly
    inside its bucket the way Prometheus' histogram_quantile does; None when it is empty."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] == 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, count
    return lower


def _add_bucket(buckets: dict[float, float], le: str, value: float) -> None:
    bound = float(le)
    buckets[bound] = buckets.get(bound, 0.0) + value


def _quantiles_ms(buckets: Mapping[float, float]) -> dict[str, float | None]:
    figures: dict[str, float | None] = {}
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        found = quantile_of_buckets(buckets, q)
        figures[label] = None if found is None else round(found * 1000, 2)
    return figures


def _bounded_int(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be an integer from {low} to {high}")
    return int(raw)


def _require_page(request: web.Request) -> None:
    """404 while admin is disabled, whatever the method (like the admin endpoints); then 405
    for a method other than GET or HEAD."""
    if request.app[keys.SETTINGS].admin.token is None:
        raise NotFound("the dashboard is disabled (set admin.token to enable it)")
    if request.method not in GET_ONLY:
        raise web.HTTPMethodNotAllowed(request.method, GET_ONLY)


def _json(payload: object) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


@functools.cache
def _asset(name: str) -> bytes:
    """A dashboard file from the package (read once: they never change while running)."""
    return (importlib.resources.files("proxy.admin") / "static" / name).read_bytes()


def _read_tail(path: Path, limit: int) -> tuple[str, int]:
    """The last `limit` bytes of `path` as text, from a line start, and its size; ("", 0) when
    there is no file yet."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(0, size - limit))
            data = file.read()
    except FileNotFoundError:
        return "", 0
    if size > limit:
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", "replace"), size
