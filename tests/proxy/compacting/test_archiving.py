"""What a compaction folds is archived verbatim, searched through /admin, and never fails a
request (proxy.compacting.background.archiving, proxy.state.archive)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.state.archive import Entry, Found, Scope
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, wait_for

ADMIN = {"Authorization": "Bearer admin-secret"}


def sqlite_state(tmp_path: Path) -> dict[str, Any]:
    return {"state": {"backend": "sqlite", "path": str(tmp_path / "state.sqlite3")}}


async def search(client: Any, proxy: Any, query: str, limit: int = 10) -> Any:
    async with client.get(
        f"{proxy.url}/admin/sessions/agent-1/archive",
        params={"q": query, "limit": str(limit)},
        headers=ADMIN,
    ) as response:
        assert response.status == 200
        return await response.json()


async def found_soon(client: Any, proxy: Any, query: str) -> list[dict[str, Any]]:
    """The results once the background write landed."""
    results: list[dict[str, Any]] = []

    async def look() -> bool:
        nonlocal results
        results = (await search(client, proxy, query))["results"]
        return bool(results)

    for _ in range(250):
        if await look():
            return results
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing archived matches {query!r}")


async def test_a_folded_tool_output_is_archived_verbatim_and_found_by_the_admin_search(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    proxy = await start(**sqlite_state(tmp_path))
    messages = conversation_of(int(WINDOW * 1.3))
    assert messages[3]["role"] == "tool"
    messages[3] = {**messages[3], "content": "pytest: FAILED test_quasar_drive with code QX-7781"}
    response = await post(client, proxy, messages)
    assert response.headers["x-compaction-status"] == "applied"

    results = await found_soon(client, proxy, "quasar QX-7781")
    assert results[0]["index"] == 3 and results[0]["kind"] == "tool_output"
    assert orjson.loads(results[0]["message"]) == messages[3]
    assert results[0]["message"] == orjson.dumps(messages[3]).decode()
    user = await search(client, proxy, "edit src/module_1.py")
    assert any(item["kind"] == "message" for item in user["results"])
    # Only folded turns: the latest request was kept, so it is not archived.
    assert (await search(client, proxy, f"summarize round {len(messages)}"))["results"] == []
    async with client.get(f"{proxy.url}/metrics") as metrics:
        text = (await metrics.read()).decode()
    assert "compaction_proxy_archive_messages_total 0.0" not in text
    assert "compaction_proxy_archive_failures_total 0.0" in text


async def test_a_growing_conversation_archives_each_folded_turn_once(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    proxy = await start(**sqlite_state(tmp_path))
    first = conversation_of(int(WINDOW * 1.3))
    await post(client, proxy, first)
    await found_soon(client, proxy, "Task 1")
    grown = conversation_of(int(WINDOW * 2.6), grow=first)
    response = await post(client, proxy, grown)
    assert response.headers["x-compaction-status"] == "applied"
    results: list[dict[str, Any]] = []
    for _ in range(250):
        found = (await search(client, proxy, "Task edit tests", limit=1000))["results"]
        results = [item for item in found if item["kind"] != "memory"]
        if results and max(item["index"] for item in results) > len(first):
            break
        await asyncio.sleep(0.02)
    indices = [item["index"] for item in results]
    assert len(indices) == len(set(indices))
    assert max(indices) > len(first)


async def test_the_admin_archive_search_refuses_bad_input_in_the_openai_shape(
    start: Any, client: Any
) -> None:
    proxy = await start()
    base = f"{proxy.url}/admin/sessions/agent-1/archive"
    for params, status in (
        ({}, 400),
        ({"q": "x", "limit": "0"}, 400),
        ({"q": "x", "limit": "a"}, 400),
    ):
        async with client.get(base, params=params, headers=ADMIN) as response:
            assert response.status == status
            body = await response.json()
            assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    async with client.get(base, params={"q": "x"}) as response:
        assert response.status == 401
    async with client.get(
        f"{proxy.url}/admin/sessions/.hidden/archive", params={"q": "x"}, headers=ADMIN
    ) as response:
        assert response.status == 400
    async with client.get(base, params={"q": "x", "limit": "5"}, headers=ADMIN) as response:
        assert response.status == 200
        assert (await response.json())["results"] == []


class BrokenArchive:
    """An archive whose backend is down: every call fails."""

    name = "broken"

    def __init__(self) -> None:
        self.adds = 0

    async def open(self) -> None:
        raise OSError("disk gone")

    async def close(self) -> None:
        return None

    async def add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        self.adds += 1
        raise OSError("disk gone")

    async def search(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> list[Found]:
        raise OSError("disk gone")

    async def compactions(self, session: str, *, tenant: str | None) -> set[str]:
        raise OSError("disk gone")


async def test_a_failing_archive_never_fails_a_request_and_is_counted_and_said_once(
    start: Any, script: Script, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    broken = BrokenArchive()
    proxy = await start({"archive_backend": broken})
    caplog.set_level(logging.INFO)
    first = conversation_of(int(WINDOW * 1.3))
    response = await post(client, proxy, first)
    assert response.status == 200 and response.headers["x-compaction-status"] == "applied"
    await wait_for(lambda: broken.adds == 1)
    response = await post(client, proxy, conversation_of(int(WINDOW * 2.6), grow=first))
    assert response.status == 200
    await wait_for(lambda: broken.adds == 2)
    await asyncio.sleep(0.05)
    async with client.get(f"{proxy.url}/metrics") as metrics:
        text = (await metrics.read()).decode()
    assert "compaction_proxy_archive_failures_total 2.0" in text
    said = [r for r in caplog.records if r.getMessage().startswith("archive write failed")]
    assert len(said) == 1
    async with client.get(
        f"{proxy.url}/admin/sessions/agent-1/archive", params={"q": "x"}, headers=ADMIN
    ) as response:
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "archive_unavailable"


async def test_archive_off_archives_nothing(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    proxy = await start(archive={"enabled": False}, **sqlite_state(tmp_path))
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.3)))
    assert response.headers["x-compaction-status"] == "applied"
    await asyncio.sleep(0.2)
    found = (await search(client, proxy, "Task edit tests"))["results"]
    assert [item for item in found if item["kind"] != "memory"] == []


async def test_requests_with_a_bogus_key_archive_no_more_than_the_total_bound(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    """A client without a valid key, every call refused upstream, still gets its requests'
    folded turns archived (the fallback folds them): they count against `archive.max_total_mb`
    like any other, so they cannot fill the disk (40 such requests added 29 MB unbounded)."""

    async def refused(request: web.Request) -> web.StreamResponse:
        error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
        return web.json_response({"error": {**error, "code": "invalid_api_key"}}, status=401)

    script.summary = script.memory = script.chat = refused
    bound_mb = 0.05
    proxy = await start(archive={"max_total_mb": bound_mb}, **sqlite_state(tmp_path))
    for number in range(40):
        messages = conversation_of(int(WINDOW * 1.3))
        messages[1] = {**messages[1], "content": f"session {number}: " + "x" * 2000}
        response = await post(
            client, proxy, messages, session=f"bogus-{number}", auth="Bearer sk-bogus"
        )
        assert response.status == 401
    archived = 0.0

    async def settled() -> bool:
        nonlocal archived
        async with client.get(f"{proxy.url}/metrics") as metrics:
            text = (await metrics.read()).decode()
        counted = [
            line
            for line in text.splitlines()
            if line.startswith("compaction_proxy_archive_messages_total")
        ]
        before, archived = archived, float(counted[0].rsplit(" ", 1)[1])
        return archived > 0 and archived == before

    for _ in range(100):
        if await settled():
            break
        await asyncio.sleep(0.1)
    with sqlite3.connect(tmp_path / "state.sqlite3") as connection:
        (kept,) = connection.execute("SELECT total(bytes) FROM archive_sizes").fetchone()
        (turns,) = connection.execute("SELECT count(*) FROM archive").fetchone()
    assert 0 < kept <= bound_mb * 2**20
    assert turns < archived  # the least recently archived went
