"""The default backend across a real restart of the proxy process: a conversation compacted
before SIGTERM or SIGKILL is reused after it, with no summarizer call and the same bytes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import factories as f
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, forwarded, post
from tests.proxy.state.conftest import SpawnProxy


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
async def test_after_a_restart_a_compacted_conversation_is_reused_byte_for_byte(
    how: signal.Signals, spawn: SpawnProxy, script: Script, client: Any
) -> None:
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    proxy = await spawn(compaction={"summary_request": "standalone"})
    messages = conversation_of(int(WINDOW * 1.1))
    first = await post(client, proxy, messages)
    assert first.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 1

    await proxy.stop(how)
    await proxy.start()

    messages = [*messages, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    second = await post(client, proxy, messages)
    assert second.status == 200
    assert second.headers["x-compaction-status"] == "reused"
    assert second.headers["x-compaction-id"] == first.headers["x-compaction-id"]
    assert len(script.calls("summary")) == 1
    assert len(script.calls("memory")) == 1
    before, after = (sent["messages"] for sent in forwarded(script))
    assert orjson.dumps(before[:2]) == orjson.dumps(after[:2])


async def test_without_a_state_file_a_restart_summarizes_again(
    spawn: SpawnProxy, script: Script, client: Any
) -> None:
    """The baseline the sqlite backend removes: with `memory`, a restart forgets."""
    proxy = await spawn(state={"backend": "memory"})
    messages = conversation_of(int(WINDOW * 1.1))
    await post(client, proxy, messages)
    await proxy.stop(signal.SIGTERM)
    await proxy.start()
    again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    assert again.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 2


async def test_a_state_file_that_cannot_be_opened_degrades_and_recovers(
    spawn: SpawnProxy, script: Script, client: Any, tmp_path: Path
) -> None:
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the state directory should be")
    proxy = await spawn(state={"path": str(blocker / "state.sqlite3"), "retry_s": 0.2})
    messages = conversation_of(int(WINDOW * 1.1))
    first = await post(client, proxy, messages)
    assert first.status == 200
    assert first.headers["x-compaction-status"] == "applied"
    again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    assert again.headers["x-compaction-status"] == "reused"  # from the in-process cache
    assert await proxy.metric(client, "compaction_proxy_state_errors_total") >= 1
    assert await proxy.metric(client, "compaction_proxy_state_degraded") == 1
    log = proxy.log.read_text()
    assert log.count("state backend unavailable") == 1

    blocker.unlink()
    blocker.mkdir()
    messages = conversation_of(int(WINDOW * 1.1), grow=[*messages, f.assistant("ok"), f.user("x")])
    for _ in range(20):  # the backend is tried again retry_s after the failure
        await post(client, proxy, messages)
        if await proxy.metric(client, "compaction_proxy_state_degraded") == 0:
            break
        await asyncio.sleep(0.1)
    assert await proxy.metric(client, "compaction_proxy_state_degraded") == 0
    assert "state backend is back" in proxy.log.read_text()
    await proxy.stop(signal.SIGTERM)
    assert (blocker / "state.sqlite3").stat().st_size > 0


async def test_a_state_file_deleted_while_serving_loses_nothing_across_a_restart(
    spawn: SpawnProxy, script: Script, client: Any, tmp_path: Path
) -> None:
    proxy = await spawn()
    messages = conversation_of(int(WINDOW * 1.1))
    sessions = ("agent-1", "agent-2")
    first = await post(client, proxy, messages, session=sessions[0])
    assert first.headers["x-compaction-status"] == "applied"
    (tmp_path / "state.sqlite3").unlink()  # an operator's clean-up, while the proxy runs
    second = await post(client, proxy, messages, session=sessions[1])
    assert second.headers["x-compaction-status"] == "applied"
    assert await proxy.metric(client, "compaction_proxy_state_files_replaced_total") == 1

    await proxy.stop(signal.SIGKILL)
    await proxy.start()
    for session in sessions:
        grown = [*messages, f.assistant("ok"), f.user(f"go on, {session}")]
        again = await post(client, proxy, grown, session=session)
        assert again.headers["x-compaction-status"] == "reused", session
    assert len(script.calls("summary")) == 2
    assert proxy.log.read_text().count("the state file vanished") == 1
