"""Every typed key the app and its requests hold state under that the handlers read.

They live in proxy.http because the handlers are their readers and the upstream client and the
session records are their values: the app factory (proxy.app), which fills them, sits above.
"""

from __future__ import annotations

from aiohttp import web

from proxy.http.sessions import AdminRecords
from proxy.http.upstream import Upstream
from proxy.interception import Hook
from proxy.logs import RequestInfo
from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.state.archive import Archive
from proxy.tasks import BackgroundTasks

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
RECORDS: web.AppKey[AdminRecords] = web.AppKey("records")
HOOK: web.AppKey[Hook] = web.AppKey("hook")
TASKS = web.AppKey("tasks", BackgroundTasks)
# The archive of folded turns (proxy.state.archive): the compacting hook writes it, admin searches it.
ARCHIVE: web.AppKey[Archive] = web.AppKey("archive")
# Its ClientSession opens while the app starts (it needs the running loop); see app.create_app.
UPSTREAM = web.AppKey("upstream", Upstream)

REQUEST_INFO = web.RequestKey("request_info", RequestInfo)
