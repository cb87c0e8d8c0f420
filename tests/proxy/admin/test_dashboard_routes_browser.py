"""The dashboard in a real browser under a hash route it cannot show (an unknown session, an id
the proxy refuses, a route that is not even a valid URI escape): the session shown before leaves
the screen, and the view says why (proxy/http/static/dashboard.js)."""

from __future__ import annotations

from typing import Any

import aiohttp
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.fakes.script import Script
from tests.proxy.admin.test_dashboard_browser import (
    TOKEN,
    browser,
    in_thread,
    log_in,
    text_of,
    wait_for,
)
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post

__all__ = ["browser"]  # the fixture

SHOWN = "agent-shown"


async def test_an_invalid_session_route_never_leaves_the_previous_session_on_screen(
    start: Any, script: Script, client: aiohttp.ClientSession, browser: WebDriver
) -> None:
    proxy = await start()
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.3)), session=SHOWN)
    assert response.headers["x-compaction-status"] == "applied"

    def routes(b: WebDriver) -> None:
        log_in(b, proxy.url, TOKEN)
        wait_for(b, lambda b: b.find_elements(By.CSS_SELECTOR, "#sessions-table tbody tr"))
        for route in ("#/session/nobody", "#/session/.hidden", "#/session/%E0%A4%A"):
            b.execute_script(f"location.hash = '#/session/{SHOWN}'")
            wait_for(b, lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline tbody tr"))
            assert text_of(b, "#session-name") == SHOWN
            b.execute_script("location.hash = arguments[0]", route)
            wait_for(b, lambda b: "No session to show" in text_of(b, "#receipts"))
            assert text_of(b, "#session-name") == ""
            assert b.find_elements(By.CSS_SELECTOR, "#timeline tbody tr") == []
            assert b.find_elements(By.CSS_SELECTOR, ".receipt") == []
            assert text_of(b, "#memory") == ""

    await in_thread(routes, browser)
