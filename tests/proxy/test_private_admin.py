"""`admin.preview_chars: 0` keeps what conversations say out of every /admin view: the records,
the archive search (`/admin/sessions/{id}/archive?q=`) and the memory view
(`/admin/api/sessions/{id}/memory`) answer with ids, kinds and counts, never the text."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fakes.script import Script
from tests.proxy.compacting.conftest import (
    WINDOW,
    conversation_of,
    post,
    script,
    small_window_proxies,
)
from tests.proxy.conftest import StartProxy

__all__ = ["script"]  # the fixture

ADMIN = {"Authorization": "Bearer admin-secret"}
CARD = "4111-1111-1111-1111"


async def _searched(client: Any, url: str) -> dict[str, Any]:
    """The archive search, once it finds an archived turn and the memory item."""
    for _ in range(250):
        async with client.get(url, params={"q": "card"}, headers=ADMIN) as response:
            assert response.status == 200
            found: dict[str, Any] = await response.json()
        if {item["kind"] for item in found["results"]} >= {"message", "memory"}:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError("nothing archived")


@pytest.mark.parametrize("preview_chars", [400, 0])
async def test_preview_chars_0_keeps_the_archive_and_memory_views_free_of_conversation_text(
    start_proxy: StartProxy, tmp_path: Path, script: Script, client: Any, preview_chars: int
) -> None:
    start = small_window_proxies(start_proxy, tmp_path, recall="on")
    proxy = await start(admin={"preview_chars": preview_chars})
    # A memory item of an earlier compaction holds the card.
    folder = tmp_path / "memory" / "agent-1"
    folder.mkdir(parents=True)
    item = {"type": "fact", "content": f"The card is {CARD}", "compaction_id": "c0"}
    (folder / "compaction_flush.jsonl").write_bytes(orjson.dumps(item) + b"\n")
    messages = conversation_of(int(WINDOW * 1.3))
    assert messages[1]["role"] == "user"
    messages[1] = {**messages[1], "content": f"Pay with my card {CARD} please"}
    response = await post(client, proxy, messages)
    assert response.headers["x-compaction-status"] == "applied"

    found = await _searched(client, f"{proxy.url}/admin/sessions/agent-1/archive")
    async with client.get(
        f"{proxy.url}/admin/api/sessions/agent-1/memory", headers=ADMIN
    ) as response:
        assert response.status == 200
        memory = await response.json()
    assert memory["size"] > 0  # the memory file holds the item either way
    if preview_chars:  # the operator chose to see the conversations
        assert CARD in str(found) and CARD in memory["text"]
        return
    assert CARD not in str(found) and CARD not in str(memory)
    # What is left says where and when, without the text.
    assert all(item["text"] == "" and item["message"] is None for item in found["results"])
    assert all("index" in item and "compaction_id" in item for item in found["results"])
