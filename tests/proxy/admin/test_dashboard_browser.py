"""The dashboard in a real browser: headless chromium (Debian's, through its chromedriver and
Selenium) against a proxy that compacted corpus conversations in all three dialects.

Selenium's calls block: they run in a thread, so the proxy (on this test's event loop) answers.
Screenshots of each page, cropped to what they show, go to `screenshots/` under this test's tmp
dir, or to the folder $COMPACTION_PROXY_SCREENSHOTS names: `docs/images` refreshes the README's
(docs/operations.md#dashboard).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from bench.corpus import read_corpus
from bench.dialects import WIRES
from bench.replay import requests_of
from tests.fakes.script import Script
from tests.proxy.conftest import RunningProxy

TOKEN = "admin-secret"
WINDOW = 8000
SCREENSHOTS_ENV = "COMPACTION_PROXY_SCREENSHOTS"
T = TypeVar("T")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "chromium and chromedriver are needed (`make test` installs Debian's chromium and "
            "chromium-driver when root; otherwise apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    # The driver is named: Selenium never looks for (or downloads) one of its own.
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield session
    finally:
        session.quit()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


def wait_for(
    browser: WebDriver, condition: Callable[[WebDriver], Any], timeout_s: float = 20
) -> Any:
    return WebDriverWait(browser, timeout_s, poll_frequency=0.1).until(condition)


def text_of(browser: WebDriver, selector: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, selector).text)


# The page's box from the top of one element to the bottom of another (at most a height), across
# the page's width.
_REGION = """
const [first, last] = [document.querySelector(arguments[0]), document.querySelector(arguments[1])];
const top = Math.max(0, first.getBoundingClientRect().top + window.scrollY - 8);
const bottom = last.getBoundingClientRect().bottom + window.scrollY + 8;
return {x: 0, y: top, width: document.documentElement.clientWidth,
        height: Math.min(bottom - top, arguments[2]), scale: 1};
"""


def save_region(
    browser: WebDriver, path: Path, first: str, last: str | None = None, max_height: int = 800
) -> None:
    """A PNG of the page from the element `first` selects down to the one `last` does (default:
    the same), below the fold too, cut at `max_height` pixels: one view per image, small enough
    to commit."""
    region = browser.execute_script(_REGION, first, last or first, max_height)
    shot = browser.execute_cdp_cmd(  # chromium's own command
        "Page.captureScreenshot",
        {"format": "png", "clip": region, "captureBeyondViewport": True},
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def number(value: int | float) -> str:
    """As the page writes it (toLocaleString in en-US)."""
    return f"{value:,}"


async def compact_corpus(
    client: aiohttp.ClientSession, proxy: RunningProxy, corpus_dir: Path
) -> list[str]:
    """The last two requests of a corpus trajectory, in each dialect: both past the trigger."""
    conversations = list(read_corpus(corpus_dir / "swe_mini_gemini3pro_toolcalls.jsonl"))
    conversations.sort(key=lambda c: len(c["messages"]))
    trajectory = conversations[len(conversations) // 2]
    prefixes = requests_of(trajectory["messages"])[-2:]
    sessions = []
    for name in ("chat", "responses", "anthropic"):
        wire = WIRES[name]
        session = f"corpus-{name}"
        headers = {"X-Session-Id": session, "Authorization": "Bearer sk-corpus"}
        for prefix in prefixes:
            body = orjson.dumps(wire.body(prefix, trajectory["tools"]))
            url = f"{proxy.url}/v1/{wire.path}"
            async with client.post(url, data=body, headers=headers) as response:
                assert response.status == 200
                assert response.headers["x-compaction-status"] in {"applied", "reused"}
        sessions.append(session)
    return sessions


def log_in(browser: WebDriver, url: str, token: str) -> None:
    browser.get(f"{url}/admin/")
    field = wait_for(browser, lambda b: b.find_element(By.ID, "token"))
    field.send_keys(token)
    browser.find_element(By.ID, "login-submit").click()


async def test_the_dashboard_shows_what_the_proxy_did_in_a_real_browser(
    start: Any,
    upstream: Any,
    script: Script,
    client: aiohttp.ClientSession,
    corpus_dir: Path,
    browser: WebDriver,
    screenshots: Path,
) -> None:
    proxy = await start(
        upstream={"anthropic_base_url": upstream.base_url},
        models={"default_context_window": WINDOW},
        compaction={"keep_recent_rounds": 3, "summary_max_tokens": 1000},
    )
    sessions = await compact_corpus(client, proxy, corpus_dir)
    admin = {"Authorization": f"Bearer {TOKEN}"}
    async with client.get(f"{proxy.url}/admin/api/sessions", headers=admin) as response:
        listed = {s["session_id"]: s for s in (await response.json())["sessions"]}

    # A wrong token is refused, and the form says so.
    def refused(b: WebDriver) -> None:
        log_in(b, proxy.url, "not-the-token")
        wait_for(b, lambda b: b.find_element(By.ID, "login-error").is_displayed())
        assert "401" in text_of(b, "#login-error")
        assert not b.find_element(By.ID, "sessions-view").is_displayed()
        assert "not-the-token" not in b.current_url
        save_region(b, screenshots / "login-refused.png", "#login-view")

    await in_thread(refused, browser)

    # The session list shows the three conversations with their figures.
    def session_list(b: WebDriver) -> None:
        log_in(b, proxy.url, TOKEN)
        rows = wait_for(
            b, lambda b: b.find_elements(By.CSS_SELECTOR, "#sessions-table tbody tr") or False
        )
        shown = {row.get_attribute("data-session"): row for row in rows}
        assert set(sessions) <= set(shown)
        for session in sessions:
            cells = [cell.text for cell in shown[session].find_elements(By.TAG_NAME, "td")]
            figures = listed[session]
            assert cells[0] == session and cells[3] == "2"
            assert cells[4] == number(figures["records_total"])
            assert cells[5:8] == [
                number(figures[key]) for key in ("tokens_sent", "tokens_forwarded", "tokens_saved")
            ]
            assert figures["tokens_saved"] > 0
        assert TOKEN not in b.current_url
        save_region(b, screenshots / "sessions.png", "#sessions-view")

    await in_thread(session_list, browser)

    # A session: its timeline, its compactions' receipts and diffs, its memory file.
    session = "corpus-anthropic"
    async with client.get(f"{proxy.url}/admin/api/sessions/{session}", headers=admin) as response:
        found = await response.json()

    def one_session(b: WebDriver) -> None:
        b.find_element(By.CSS_SELECTOR, f'tr[data-session="{session}"] td:nth-child(2)').click()
        wait_for(b, lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline tbody tr") or False)
        assert text_of(b, "#session-name") == session
        rows = b.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")
        assert len(rows) == len(found["timeline"]) == 2
        for row, entry in zip(rows, found["timeline"], strict=True):
            cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            assert cells[2] == entry["status"] and entry["status"] in {"applied", "reused"}
            assert cells[3:5] == [number(entry["tokens_before"]), number(entry["tokens_after"])]
            assert entry["tokens_after"] < found["trigger"] < entry["tokens_before"]
        receipts = b.find_elements(By.CSS_SELECTOR, ".receipt")
        assert len(receipts) == len(found["records"]) >= 1
        record = found["records"][-1]  # the newest is shown first
        first = receipts[0]
        assert first.get_attribute("data-compaction") == record["id"]
        tokens = first.find_element(By.CSS_SELECTOR, ".receipt-tokens").text
        assert tokens == f"{number(record['tokens_before'])} → {number(record['tokens_after'])}"
        assert first.find_element(By.CSS_SELECTOR, "pre.summary").text.strip()
        diff = record["diff"]
        removed = first.find_elements(By.CSS_SELECTOR, ".diff-removed li")
        added = first.find_elements(By.CSS_SELECTOR, ".diff-added li")
        assert len(removed) == len(diff["removed"]) > 0 and len(added) == len(diff["added"]) > 0
        assert any("summary of earlier conversation" in item.text for item in added)
        assert text_of(b, "#memory").strip() not in ("", "(no memory file yet)")
        save_region(b, screenshots / "timeline.png", "#session-view h2", "#timeline")
        save_region(b, screenshots / "receipt.png", ".receipt", ".receipt .memory-items")
        diff_top, diff_end = ".receipt h5:nth-of-type(3)", ".receipt .diff"
        save_region(b, screenshots / "diff.png", diff_top, diff_end, max_height=560)

    await in_thread(one_session, browser)

    # The live figures move under load.
    def requests_shown(b: WebDriver) -> int:
        return int(text_of(b, "#live-requests").replace(",", "") or 0)

    before = await in_thread(requests_shown, browser)
    small = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    async def one_request() -> None:
        async with client.post(f"{proxy.url}/v1/chat/completions", data=small) as response:
            assert response.status == 200

    await asyncio.gather(*(one_request() for _ in range(40)))

    def moved(b: WebDriver) -> None:
        wait_for(b, lambda b: requests_shown(b) >= before + 40)
        wait_for(b, lambda b: text_of(b, "#live-rps") not in ("–", "0.0"))
        assert text_of(b, "#live-state") == "healthy"
        save_region(b, screenshots / "live.png", "#live")

    await in_thread(moved, browser)
    names = ("login-refused", "sessions", "timeline", "receipt", "diff", "live")
    for name in names:
        assert (screenshots / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name
