"""Logs carry ids and counts, never what a conversation says: a compaction's log line (and every
other line a compacted request causes) holds no summary, memory item or diff preview; the text
goes to `logging.dump_dir` only (docs/operations.md, Logs)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from proxy.http import keys
from proxy.logs import JsonFormatter
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

SECRET = "my card is 4111-1111-1111-1111 and my password is hunter2-zebra"


async def test_a_compaction_logs_ids_and_counts_but_never_the_conversations_text(
    start_proxy: StartProxy,
    tmp_path: Path,
    script: Script,
    client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    start = small_window_proxies(start_proxy, tmp_path, recall="on")
    proxy = await start()
    # A summarizer that repeats it, as a faithful one does, and a memory item that holds it.
    item = f'[{{"type": "fact", "content": "The user said: {SECRET}"}}]'
    script.summary = script.answer(f"## Facts\n- The user said: {SECRET}<memory>{item}</memory>")
    messages = conversation_of(int(WINDOW * 1.3))
    # The user says it in an early turn, which the compaction folds, mines and summarizes.
    assert messages[1]["role"] == "user"
    messages[1] = {**messages[1], "content": f"{messages[1]['content']}. Remember: {SECRET}"}
    response = await post(client, proxy, messages)
    assert response.headers["x-compaction-status"] == "applied"
    # The receipt on /admin has it (admin.preview_chars is on): the log line alone must not.
    record = proxy.app[keys.RECORDS].get("agent-1")
    assert record is not None and SECRET in str(record["records"][-1])

    formatter = JsonFormatter()
    lines = [formatter.format(record) for record in caplog.records]
    # (Its path is llm, or a fallback on a loaded machine: the line is the same either way.)
    compaction = [line for line in lines if '"msg":"compaction ' in line]
    assert len(compaction) == 1
    for fragment in ("4111-1111", "hunter2-zebra"):
        assert not any(fragment in line for line in lines), fragment
    # Ids and counts stay.
    assert '"compaction_id"' in compaction[0] and '"memory_items"' in compaction[0]
