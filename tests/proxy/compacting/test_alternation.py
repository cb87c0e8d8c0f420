"""`compaction.strict_alternation`: compacted requests that strict chat templates accept."""

from __future__ import annotations

from typing import Any

import pytest

from compaction import is_summary_message
from compaction.invariants import check_tool_pairing
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream, alternation_problem, strict_alternation
from tests.proxy.compacting.conftest import WINDOW, conversation_of, forwarded, post


@pytest.fixture
def strict(upstream: FakeUpstream, script: Script) -> Script:
    """The script behind an upstream that refuses two user (or assistant) turns in a row."""
    upstream.reply(strict_alternation(upstream.default))
    return script


async def test_with_strict_alternation_the_compacted_request_alternates(
    start: Any, strict: Script, client: Any
) -> None:
    proxy = await start(compaction={"strict_alternation": True})
    messages = conversation_of(int(WINDOW * 1.3))
    assert alternation_problem(messages) is None
    response = await post(client, proxy, messages)
    assert response.status == 200, await response.text()
    assert response.headers["x-compaction-status"] == "applied"
    out = forwarded(strict)[0]["messages"]
    assert is_summary_message(out[1]) and out[2]["role"] == "assistant"
    assert alternation_problem(out) is None and check_tool_pairing(out) == []
    assert "Task 1: edit src/module_1.py" in out[1]["content"]  # the task, quoted, not pinned
    assert out[-1] == messages[-1]


async def test_without_it_the_pinned_task_after_the_summary_is_refused(
    start: Any, strict: Script, client: Any
) -> None:
    proxy = await start()  # off by default: OpenAI accepts two user messages in a row
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.3)))
    assert response.status == 400
    assert "roles must alternate" in (await response.json())["error"]["message"]
