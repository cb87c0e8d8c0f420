"""The dashboard's sessions page with many sessions recorded: how long the proxy takes to answer
`GET /admin/api/sessions` (sorted, filtered, paged on the server) with 10,000 sessions, each with
a full timeline and a few compaction records.

    .venv/bin/python -m bench.dashboard [--sessions 10000] [--rounds 30]

The real app (create_app) on loopback, its records filled directly; the client runs in the same
process. Prints the median and p99 per query; the target is at most 200 ms. Nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

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


def fill(app_records: SessionRecords, sessions: int, per_session: int) -> None:
    dialects = ("chat", "responses", "messages")
    for i in range(sessions):
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


async def run(sessions: int, rounds: int) -> None:
    # Room for every session: at the default `admin.max_records_mb` (32) the records keep the
    # ~1,900 most recently seen of these (each holds a full timeline).
    admin = {"token": TOKEN, "max_sessions": sessions, "max_records_mb": 1024}
    settings = Settings.build({"state": {"backend": "memory"}, "admin": admin})
    app = create_app(settings)
    started = time.perf_counter()
    fill(app[keys.RECORDS], sessions, settings.admin.records_per_session)
    kept = app[keys.RECORDS].page(limit=0)["total"]
    print(f"{sessions} sessions recorded in {time.perf_counter() - started:.1f} s, {kept} kept")
    if kept != sessions:
        raise SystemExit(f"only {kept} of {sessions} sessions kept: raise admin.max_records_mb")
    # A running proxy's records were made over hours and already met the collector (which
    # untracks dicts of plain values); made all at once here, the first full collection would
    # land inside one timed request.
    gc.collect()
    runner, url = await serve_on_loopback(app)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(run(args.sessions, args.rounds))


if __name__ == "__main__":
    main()
