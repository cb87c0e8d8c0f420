"""The dashboard's sessions page with many sessions recorded: how long the proxy takes to answer
`GET /admin/api/sessions` (sorted, filtered, paged on the server) with 10,000 sessions, each with
a full timeline and a few compaction records.

    .venv/bin/python -m bench.dashboard [--sessions 10000] [--rounds 30] [--loads 0]
        [--redis-url redis://127.0.0.1:6379/15]

The real app (create_app) on loopback, its records filled directly; the client runs in the same
process. Prints the median and p99 per query; the target is at most 200 ms. With `--loads N`, also
N first loads of the page in a real browser (headless chromium through Selenium, a new browser
each time, as a person opening the dashboard: the page, the token typed in its form, the list):
how long until the first session shows, at most `--wait-s` (10 s) each, and whether it showed;
then as many reloads of the last browser. With `--redis-url`, the records are shared in that
Redis (`state.backend: redis`: what every replica reads; the bench deletes nothing, give it an
empty database). Nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import time
from typing import Any

import aiohttp

from proxy.admin.records import SessionRecords
from proxy.app import create_app
from proxy.http import keys
from proxy.http.serving import serve_on_loopback
from proxy.outcome import Outcome
from proxy.settings import Settings

TOKEN = "bench-admin"
QUERIES = (
    "sessions",
    "sessions?sort=tokens_saved",
    "sessions?sort=session_id&order=asc&offset=5000",
    "sessions?q=messages",
    "sessions?q=agent-99",
    "sessions?sort=requests&limit=500",
)


def fill(app_records: SessionRecords, sessions: int, per_session: int, first: int = 0) -> None:
    """Sessions `agent-{first}` to `agent-{first + sessions - 1}`, each with `per_session`
    requests in its timeline and a compaction record every tenth."""
    dialects = ("chat", "responses", "messages")
    for i in range(first, first + sessions):
        session = f"agent-{i}"
        dialect = dialects[i % 3]
        for j in range(per_session):
            before = 1000 * j + i % 997
            compacted = j % 10 == 9
            app_records.touch(session)
            app_records.add_request(
                session,
                (
                    1_767_225_600.0,  # 2026-01-01
                    dialect,
                    Outcome(
                        "applied" if compacted else "none",
                        session,
                        before,
                        before // 3 if compacted else before,
                    ),
                    None,
                    before * 4,
                    before * 4,
                    200,
                    0.4,
                ),
            )
            if compacted:
                app_records.add_record(
                    session,
                    {
                        "dialect": dialect,
                        "model": f"model-{i % 7}",
                        "path": "llm",
                        "window": 128000,
                    },
                )


async def run(sessions: int, rounds: int, loads: int, wait_s: float, redis_url: str | None) -> None:
    # Room for every session: at the default `admin.max_records_mb` (32) the records keep the
    # ~1,900 most recently seen of these (each holds a full timeline).
    admin = {"token": TOKEN, "max_sessions": sessions, "max_records_mb": 1024}
    state = {"backend": "redis", "redis_url": redis_url} if redis_url else {"backend": "memory"}
    settings = Settings.build({"state": state, "admin": admin})
    app = create_app(settings)
    records = app[keys.RECORDS]
    # Started first: the shared records (Redis) take their writes once the app runs.
    runner, url = await serve_on_loopback(app)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        started = time.perf_counter()
        idle = app[keys.TASKS].queued  # with Redis, its notices' listener
        for first in range(0, sessions, 100):
            fill(records, min(100, sessions - first), settings.admin.records_per_session, first)
            while app[keys.TASKS].queued > idle:  # the shared records' writes, in the background
                await asyncio.sleep(0.001)
        kept = (await records.read_page(limit=0))["total"]
        took_s = time.perf_counter() - started
        print(f"{sessions} sessions recorded ({state['backend']}) in {took_s:.1f} s, {kept} kept")
        if kept != sessions:
            raise SystemExit(f"only {kept} of {sessions} sessions kept: raise admin.max_records_mb")
        # A running proxy's records were made over hours and already met the collector (which
        # untracks dicts of plain values); made all at once here, the first full collection
        # would land inside one timed request.
        gc.collect()
        if loads:
            await asyncio.to_thread(measure_loads, url, loads, wait_s)
        async with aiohttp.ClientSession() as client:
            for query in QUERIES:
                took: list[float] = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    async with client.get(f"{url}/admin/api/{query}", headers=headers) as response:
                        assert response.status == 200, await response.text()
                        page = await response.json()
                    took.append((time.perf_counter() - started) * 1000)
                took.sort()
                p99 = took[min(len(took) - 1, round(0.99 * (len(took) - 1)))]
                print(
                    f"GET /admin/api/{query:<48} total {page['total']:>6}  "
                    f"median {statistics.median(took):6.1f} ms  p99 {p99:6.1f} ms"
                )
    finally:
        await runner.cleanup()


def measure_loads(url: str, loads: int, wait_s: float) -> None:
    """`loads` first loads, each in a new browser, then `loads` reloads of the last one: the
    time from asking for the page to the first session row on screen (Selenium's calls block:
    this runs in a thread, the proxy answers on the event loop)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    row = (By.CSS_SELECTOR, "#sessions-table tbody tr")

    def first_row(browser: Any) -> float | None:
        try:
            WebDriverWait(browser, wait_s, poll_frequency=0.02).until(
                lambda b: b.find_elements(*row)
            )
        except TimeoutException:
            return None
        return (time.perf_counter() - started) * 1000

    def report(label: str, took: list[float | None]) -> None:
        shown = sorted(t for t in took if t is not None)
        median = f"median {statistics.median(shown):7.1f} ms" if shown else "median      – ms"
        every = ", ".join("none" if t is None else f"{t:.0f}" for t in took)
        print(
            f"{label:<14} sessions shown within {wait_s:g} s in {len(shown)} of {len(took)}  "
            f"{median}  (each, ms: {every})"
        )

    firsts: list[float | None] = []
    browser = None
    for _ in range(loads):
        if browser is not None:
            browser.quit()
        browser = open_browser()
        started = time.perf_counter()
        browser.get(f"{url}/admin/")
        field = WebDriverWait(browser, wait_s).until(
            lambda b: (
                b.find_element(By.ID, "token").is_displayed() and b.find_element(By.ID, "token")
            )
        )
        field.send_keys(TOKEN)
        browser.find_element(By.ID, "login-submit").click()
        firsts.append(first_row(browser))
    report("first loads", firsts)
    reloads: list[float | None] = []
    assert browser is not None
    try:
        for _ in range(loads):
            started = time.perf_counter()
            browser.refresh()
            reloads.append(first_row(browser))
    finally:
        browser.quit()
    report("reloads", reloads)


def open_browser() -> Any:
    """Headless chromium through Debian's chromedriver (as tests/proxy/admin's browser tests)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit(
            "--loads needs chromium and chromedriver (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--loads", type=int, default=0, help="first loads in a real browser")
    parser.add_argument("--wait-s", type=float, default=10.0)
    parser.add_argument(
        "--redis-url", help="records shared in this Redis (state.backend: redis), not in-process"
    )
    args = parser.parse_args()
    asyncio.run(run(args.sessions, args.rounds, args.loads, args.wait_s, args.redis_url))


if __name__ == "__main__":
    main()
