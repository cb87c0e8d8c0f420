"""compaction.strategy through the real proxy: previews instead of a summary, remembered and
reused byte for byte, archived whole, recorded; `summary` keeps summarizing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from compaction.marker import PREVIEW_MARK
from proxy.http import keys
from tests import factories as f
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import forwarded, post
from tests.proxy.compacting.fast.drive import DIALECTS, drive, grown
from tests.proxy.compacting.fast.drive import WINDOW as DRIVE_WINDOW
from tests.proxy.compacting.fast.drive import tokens as drive_tokens
from tests.proxy.compacting.test_archiving import found_soon, search, sqlite_state

WINDOW = 16_000
OUTPUT = "".join(f"src/package/module_{i}.py: 0 errors\n" for i in range(150))  # ~5k characters


def listing_history(blocks: int) -> list[Any]:
    """A task, then `blocks` tool blocks with long listings, then a request."""
    messages = [f.system(), f.user("Audit every module.")]
    for _ in range(blocks):
        messages += f.tool_block(output=OUTPUT)
    return [*messages, f.user(f"Report on the {len(messages)} messages so far.")]


async def test_previews_go_out_instead_of_a_summary_and_are_reused_byte_for_byte(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    # At the defaults (target 0.45, trigger 0.85) previews alone are enough once they bring the
    # request to 0.65 of the window: sixteen long listings get there, not to the target.
    proxy = await start(models={"default_context_window": WINDOW}, **sqlite_state(tmp_path))
    first = listing_history(16)
    response = await post(client, proxy, first)
    assert response.headers["x-compaction-status"] == "applied"
    grown = [*first, f.assistant("All modules are clean."), f.user("Thanks, and the tests?")]
    again = await post(client, proxy, grown)
    assert again.headers["x-compaction-status"] == "reused"

    assert script.calls("summary") == [] and script.calls("memory") == []
    sent_first, sent_again = (body["messages"] for body in forwarded(script))
    assert len(sent_first) == len(first)  # previews in place: no message folded away
    assert orjson.dumps(sent_again[: len(first)]) == orjson.dumps(sent_first)
    assert sent_again[len(first) :] == grown[len(first) :]
    previews = [m for m in sent_first if PREVIEW_MARK in str(m.get("content"))]
    assert previews and all(m["role"] == "tool" for m in previews)
    assert [m.get("tool_call_id") for m in sent_first] == [m.get("tool_call_id") for m in first]

    record = proxy.app[keys.RECORDS].get("agent-1")["records"][0]
    assert record["path"] == "selective" and record["strategy"] == "selective"
    assert record["previews"] == len(previews) and record["model_calls"] == 0
    assert 0.45 * WINDOW < record["tokens_after"] <= 0.65 * WINDOW < record["tokens_before"]
    # The reduced outputs are archived whole, for recall.
    reduced = next(i for i, (m, s) in enumerate(zip(first, sent_first, strict=True)) if m != s)
    assert "module_100.py" not in str(sent_first[reduced]["content"])  # cut from the preview
    await found_soon(client, proxy, "module_100.py")
    results = (await search(client, proxy, "module_100.py", limit=100))["results"]
    archived = {item["index"]: orjson.loads(item["message"]) for item in results}
    assert archived[reduced] == first[reduced]


async def test_a_request_with_previews_only_carries_the_recall_tool_when_recall_is_on(
    start: Any, script: Script, client: Any
) -> None:
    """The previews say the whole output can be recalled: the request that carries them carries
    the tool, though it has no summary to put the recall line in (the agent's own tools sent:
    a request without tools gets no recall)."""
    proxy = await start(
        models={"default_context_window": WINDOW},
        compaction={"recall": "on"},  # previews are enough here (see above)
    )
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    response = await post(client, proxy, listing_history(16), tools=tools)
    assert response.headers["x-compaction-status"] == "applied"

    sent = forwarded(script)[0]
    assert any(PREVIEW_MARK in str(m.get("content")) for m in sent["messages"])
    assert [tool["function"]["name"] for tool in sent["tools"]][-1:] == ["recall"]


async def test_the_summary_strategy_summarizes_the_same_history(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(
        models={"default_context_window": WINDOW}, compaction={"strategy": "summary"}
    )
    response = await post(client, proxy, listing_history(16))
    assert response.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 1
    record = proxy.app[keys.RECORDS].get("agent-1")["records"][0]
    # What the upstream received: one cached question, or the summary asked standalone.
    calls = len(script.calls("summary")) + len(script.calls("memory"))
    assert record["strategy"] == "summary" and record["model_calls"] == calls


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_previewed_conversation_is_answered_from_what_is_remembered_with_the_same_bytes(
    start: Any,
    script: Script,
    client: Any,
    upstream: FakeUpstream,
    tmp_path: Path,
    dialect: str,
) -> None:
    messages = [f.system(), f.user("Audit every module.")]
    while drive_tokens(dialect, [*messages, f.user("Go on.")]) < 0.8 * DRIVE_WINDOW:
        messages += f.tool_block(output=OUTPUT)
    requests = [[*messages, f.user("Report.")]]
    for step in range(6):
        requests.append(grown(requests[-1], step))

    known = await drive(start, script, client, upstream, tmp_path / "a", dialect, requests)
    parsed = await drive(
        start, script, client, upstream, tmp_path / "b", dialect, requests, known_mb=0
    )
    assert known.summaries == parsed.summaries == 0
    statuses = [outcome[0] for outcome in known.outcomes]
    assert "applied" in statuses and statuses.count("reused") >= 3, statuses
    reused = [i for i, status in enumerate(statuses) if status == "reused"]
    assert all(known.decided_known[i] > known.decided_known[i - 1] for i in reused)
    assert known.forwarded == parsed.forwarded  # spliced from the index as the full path does
