"""Every typed key the app and its requests hold state under."""

from __future__ import annotations

from aiohttp import web

from proxy.compacting.records import SessionRecords
from proxy.compacting.workers import Workers
from proxy.hook import Hook
from proxy.http.upstream import Upstream
from proxy.logs import RequestInfo
from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.tasks import BackgroundTasks

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
RECORDS = web.AppKey("records", SessionRecords)
HOOK: web.AppKey[Hook] = web.AppKey("hook")
TASKS = web.AppKey("tasks", BackgroundTasks)
# Its ClientSession opens while the app starts (it needs the running loop); see app.create_app.
UPSTREAM = web.AppKey("upstream", Upstream)
# The processes compactions' CPU work runs in (started on first use, stopped with the app).
WORKERS = web.AppKey("workers", Workers)

REQUEST_INFO = web.RequestKey("request_info", RequestInfo)
