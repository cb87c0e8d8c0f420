"""The dashboard's first load in a real browser (headless chromium) with thousands of sessions,
behind a front that fails the first call for the session list and leaves the second unanswered
(a balancer whose replica restarts, a connection that died without a word): the list shows the
newest sessions anyway, and says meanwhile why it is not there yet
(proxy/admin/static/dashboard.js).
The sessions are recorded as forwarding records them (bench.dashboard.fill), not through
thousands of requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from bench.dashboard import fill
from proxy.http import keys
from proxy.http.serving import serve_on_loopback
from tests.proxy.admin.test_dashboard_browser import (
    TOKEN,
    browser,
    in_thread,
    log_in,
    text_of,
    wait_for,
)
from tests.proxy.conftest import RunningProxy

__all__ = ["browser"]  # the fixture

SESSIONS = 2000
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
}


class Front:
    """A front on loopback that relays the dashboard's calls to the proxy, but fails the first
    call for the session list (502) and never answers the second (until the browser gives up)."""

    def __init__(self, proxy_url: str) -> None:
        self.proxy_url = proxy_url
        self.list_calls = 0
        self.url = ""
        self._client: aiohttp.ClientSession | None = None

    async def relay(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/admin/api/sessions":
            self.list_calls += 1
            if self.list_calls == 1:
                return web.Response(status=502, text="<html>bad gateway</html>")
            if self.list_calls == 2:
                await asyncio.Event().wait()  # until the browser lets go
        assert self._client is not None
        async with self._client.get(
            f"{self.proxy_url}{request.path_qs}", headers=request.headers
        ) as answer:
            body = await answer.read()
            headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
            return web.Response(status=answer.status, body=body, headers=headers)

    async def __aenter__(self) -> Front:
        self._client = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.relay)
        self._runner, self.url = await serve_on_loopback(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        assert self._client is not None
        await self._client.close()


@pytest.fixture
async def front(start: Any) -> AsyncIterator[tuple[RunningProxy, Front]]:
    proxy = await start()
    fill(proxy.app[keys.RECORDS], SESSIONS, 5)
    async with Front(proxy.url) as front:
        yield proxy, front


async def test_the_first_load_shows_the_newest_sessions_after_a_failed_and_a_hung_call(
    front: tuple[RunningProxy, Front], browser: WebDriver
) -> None:
    proxy, relay = front

    def first_load(b: WebDriver) -> list[str]:
        log_in(b, relay.url, TOKEN)
        wait_for(b, lambda b: "trying again" in text_of(b, "#page-info"))
        rows = wait_for(
            b, lambda b: b.find_elements(By.CSS_SELECTOR, "#sessions-table tbody tr") or False
        )
        assert text_of(b, "#page-info") == f"1–50 of {SESSIONS}"
        return [str(row.get_attribute("data-session")) for row in rows]

    shown = await in_thread(first_load, browser)
    assert relay.list_calls == 3
    newest = proxy.app[keys.RECORDS].page(limit=50)["sessions"]
    assert shown == [s["session_id"] for s in newest]
    assert shown[0] == f"agent-{SESSIONS - 1}"
