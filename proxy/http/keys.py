"""Every typed key the app and its requests hold state under that the handlers read.

They live in proxy.http because the handlers are their readers and the upstream client and the
session records are their values: the app factory (proxy.app), which fills them, sits above.
The session records are proxy.admin.records; proxy.http writes them through `AdminRecords`,
the part of them the handlers and the admin routes use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from aiohttp import web

from proxy.http.upstream import Upstream
from proxy.interception import Hook
from proxy.logs import RequestInfo
from proxy.metrics import Metrics
from proxy.outcome import Outcome, RecallFigures
from proxy.settings import Settings
from proxy.state.archive import Archive
from proxy.tasks import BackgroundTasks

TimelineLine = tuple[float, str, Outcome | None, RecallFigures | None, int, int, int, float]
"""One hooked request as forwarding saw it: when it was relayed (`time.time()`), the route's API
shape (chat, responses, messages), what the hook did (its `Outcome`; None: nothing told), the
recall rounds a followup answered (None: none), the bytes as sent and as forwarded, the
upstream's status, the proxy's own time before forwarding (ms). A plain tuple of the objects
the request already holds: a request pays for it, not for a document; `AdminRecords.timeline`
makes the documents when the dashboard asks (a named tuple cost a microsecond more per
request)."""


class AdminRecords(Protocol):
    """The records the app keeps per session (proxy.admin.records), as proxy.http and the admin
    routes use them: a forwarded request is counted and put in its session's timeline, /admin
    lists the sessions and shows one, the dashboard pages through them (the `read_*` methods:
    the sync ones read the process's own records)."""

    def touch(self, session_id: str) -> None: ...

    def list(self) -> dict[str, Any]: ...

    def get(self, session_id: str) -> dict[str, Any] | None: ...

    def add_request(self, session_id: str, line: TimelineLine) -> None:
        """A hooked request's line in its session's timeline (proxy.http.forwarding)."""
        ...

    def page(
        self,
        *,
        sort: str = "last_seen",
        descending: bool = True,
        search: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """One page of session summaries for the dashboard, ordered by a sortable field."""
        ...

    def timeline(self, session_id: str) -> Sequence[dict[str, Any]] | None: ...

    def overhead_quantiles(self) -> dict[str, float | None]: ...

    async def read_page(
        self,
        *,
        sort: str = "last_seen",
        descending: bool = True,
        search: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """`page` as the admin routes read it: every replica's sessions when the records are
        shared (state.backend redis), the process's own otherwise."""
        ...

    async def read_list(self) -> dict[str, Any]: ...

    async def read_session(
        self, session_id: str, *, timeline: bool = True
    ) -> dict[str, Any] | None:
        """Its summary, compaction records and timeline, read as `read_page` reads."""
        ...


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
