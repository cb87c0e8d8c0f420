"""Faults an adversarial pass found in compaction, end to end through the real proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson

from compaction import is_summary_message
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post
from tests.proxy.conftest import RunningProxy

ADMIN = {"Authorization": "Bearer admin-secret"}


async def records_of(
    client: aiohttp.ClientSession, proxy: RunningProxy, session: str
) -> list[dict[str, Any]]:
    async with client.get(f"{proxy.url}/admin/sessions/{session}", headers=ADMIN) as response:
        assert response.status == 200
        records: list[dict[str, Any]] = (await response.json())["records"]
        return records


async def test_a_symlinked_memory_file_is_not_followed_and_the_request_still_served(
    start: Any, script: Script, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious\n")
    link = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    proxy = await start()
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    assert outside.read_bytes() == b"precious\n"
    (record,) = await records_of(client, proxy, "agent-1")
    assert any("memory flush failed" in error for error in record["errors"])


async def test_a_compacted_request_keeps_every_other_field_byte_for_byte(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    messages = orjson.dumps(conversation_of(int(WINDOW * 1.2)))
    head = b'{ "model" : "gpt-test",\n  "seed": 123456789012345678901234567890123, "messages" : '
    tail = b', "temperature": 1.50, "n": 1E0, "metadata": {"tag": "caf\\u00e9"} }'
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=head + messages + tail,
        headers={"Content-Type": "application/json", "X-Session-Id": "agent-1"},
    ) as response:
        assert response.headers["x-compaction-status"] == "applied"
    (sent,) = script.calls(None)
    assert sent.body.startswith(head) and sent.body.endswith(tail)
    assert is_summary_message(orjson.loads(sent.body)["messages"][1])
