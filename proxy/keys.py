"""Every typed key the app and its requests hold state under."""

from __future__ import annotations

from aiohttp import web

from proxy.hook import ChatPipeline
from proxy.http.sessions import SessionRecords
from proxy.http.upstream import Upstream
from proxy.logs import RequestInfo
from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.tasks import BackgroundTasks

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
RECORDS = web.AppKey("records", SessionRecords)
CHAT_PIPELINE: web.AppKey[ChatPipeline] = web.AppKey("chat_pipeline")
TASKS = web.AppKey("tasks", BackgroundTasks)
# Set while the app runs (the ClientSession needs the running loop); see app._upstream_ctx.
UPSTREAM = web.AppKey("upstream", Upstream)

REQUEST_INFO = web.RequestKey("request_info", RequestInfo)
