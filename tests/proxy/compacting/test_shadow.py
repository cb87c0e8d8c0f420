"""compaction.mode: shadow through the real proxy: every compaction computed and recorded as `on`
would, the client's own bytes forwarded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.corpus import read_corpus
from bench.dialects import WIRES
from bench.replay import replay_on_and_shadow, shadow_differences
from proxy.admin.records import SessionRecords
from proxy.http import keys
from tests import factories as f
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post
from tests.proxy.conftest import RunningProxy

# The figures of a compaction record that do not depend on time or on random ids.
_FIGURES = (
    "reason",
    "path",
    "dialect",
    "model",
    "window",
    "messages_before",
    "messages_after",
    "tokens_before",
    "tokens_after",
    "folded_messages",
    "folded_range",
    "summary",
    "memory_items",
    "quality",
    "fits",
    "diff",
)
_HEADERS = ("x-compaction-tokens-before", "x-compaction-tokens-after", "x-compaction-session")


def _traffic() -> list[list[dict[str, Any]]]:
    """A conversation past the trigger, then continued twice."""
    first = conversation_of(int(WINDOW * 1.1))
    second = [*first, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    third = [*second, f.assistant("Done that too."), f.user("And the tests?")]
    return [first, second, third]


async def _drive(
    proxy: RunningProxy, client: Any, traffic: list[list[dict[str, Any]]]
) -> tuple[list[Any], list[bytes]]:
    """The responses to `traffic` and the bodies sent."""
    responses, bodies = [], []
    for messages in traffic:
        bodies.append(orjson.dumps({"model": "gpt-test", "messages": messages}))
        responses.append(await post(client, proxy, messages))
    return responses, bodies


def _items(memory_file: Path) -> list[dict[str, Any]]:
    """The memory file's items, less when and by which compaction (a random id) they were written."""
    items = [orjson.loads(line) for line in memory_file.read_bytes().splitlines()]
    return [{k: item[k] for k in ("type", "content", "session_id")} for item in items]


def _figures(proxy: RunningProxy) -> list[dict[str, Any]]:
    records: SessionRecords = proxy.app[keys.RECORDS]
    session = records.get("agent-1")
    assert session is not None
    return [{k: record[k] for k in (*_FIGURES, "mode")} for record in session["records"]]


async def test_shadow_forwards_the_clients_bytes_and_records_what_on_does(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    on = await start(memory={"dir": str(tmp_path / "on")})
    traffic = _traffic()
    on_responses, _ = await _drive(on, client, traffic)
    on_forwarded = [r.body for r in script.calls(None)]
    shadow = await start(compaction={"mode": "shadow"}, memory={"dir": str(tmp_path / "shadow")})
    shadow_responses, sent = await _drive(shadow, client, traffic)
    shadow_forwarded = [r.body for r in script.calls(None)][len(on_forwarded) :]

    # The upstream got exactly the client's bytes in shadow; `on` compacted them.
    assert shadow_forwarded == sent
    assert all(len(out) < len(body) for out, body in zip(on_forwarded, sent, strict=True))
    assert [r.headers["x-compaction-status"] for r in on_responses] == [
        "applied",
        "reused",
        "reused",
    ]
    assert [r.headers["x-compaction-status"] for r in shadow_responses] == ["shadow"] * 3
    for on_response, shadow_response in zip(on_responses, shadow_responses, strict=True):
        assert [on_response.headers[h] for h in _HEADERS] == [
            shadow_response.headers[h] for h in _HEADERS
        ]
    # The same compactions, with the same figures, and the same memory file.
    on_figures, shadow_figures = _figures(on), _figures(shadow)
    assert len(on_figures) == len(shadow_figures) == 1
    for key in _FIGURES:
        assert shadow_figures[0][key] == on_figures[0][key], key
    # What was only computed says so: the dashboard tells it from what was forwarded.
    assert on_figures[0]["mode"] == "on" and shadow_figures[0]["mode"] == "shadow"
    memory = "agent-1/compaction_flush.jsonl"
    assert _items(tmp_path / "shadow" / memory) == _items(tmp_path / "on" / memory) != []
    assert len(script.calls("summary")) == 2


async def test_shadow_is_what_the_timeline_and_the_metrics_say(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"mode": "shadow"})
    _, sent = await _drive(proxy, client, _traffic())
    records: SessionRecords = proxy.app[keys.RECORDS]
    timeline = records.timeline("agent-1")
    assert timeline is not None
    assert [entry["status"] for entry in timeline] == ["shadow"] * 3
    assert [entry["bytes_after"] for entry in timeline] == [len(body) for body in sent]
    registry = proxy.app[keys.METRICS].registry
    decisions = "compaction_proxy_chat_decisions_total"
    assert registry.get_sample_value(decisions, {"status": "shadow", "dialect": "chat"}) == 3
    assert registry.get_sample_value(decisions, {"status": "applied", "dialect": "chat"}) is None


async def test_shadow_leaves_requests_below_the_trigger_as_none(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"mode": "shadow"})
    response = await post(client, proxy, conversation_of(WINDOW // 4))
    assert response.headers["x-compaction-status"] == "none"


def _corpus_conversations(corpus_dir: Path) -> list[dict[str, Any]]:
    """Three coding trajectories of some twenty requests each, with tool calls: two of one
    agent, one of another (large tool outputs)."""
    picked = []
    for name, shares in (("swe_mini_gemini3pro_toolcalls", (10, 4)), ("swe_gym_openhands", (4,))):
        rows = list(read_corpus(corpus_dir / f"{name}.jsonl"))
        rows.sort(key=lambda row: len(row["messages"]))
        picked += [rows[len(rows) // share] for share in shares]
    return picked


@pytest.mark.parametrize("dialect", list(WIRES))
async def test_shadow_over_corpus_replays_forwards_every_request_as_sent_and_records_what_on_does(
    corpus_dir: Path, dialect: str
) -> None:
    """bench.replay's shadow proof on a small replay: the same conversations, at once, through
    a proxy in `on` and one in `shadow`, over the same answers, nothing depending on timing."""
    conversations = _corpus_conversations(corpus_dir)
    pace = argparse.Namespace(summary_delay=0.01, reply_delay=0.0)
    # Compactions run inline: where they run changes nothing here, and workers cost ten times
    # the time.
    inline = {"workers": 0}
    on, shadow = await replay_on_and_shadow(conversations, 4000, WIRES[dialect], pace, inline)

    assert on.statuses["applied"] >= 4
    # What `on` compacted (applied, reused) says shadow; the rest (none, failed) as in `on`.
    told = {status: n for status, n in on.statuses.items() if status not in ("applied", "reused")}
    told["shadow"] = on.statuses["applied"] + on.statuses["reused"]
    assert dict(shadow.statuses) == told
    assert all(len(found["records"]) >= 2 for found in on.records.values())
    assert len(on.records) == len(shadow.records) == 3
    assert shadow_differences(on, shadow) == []
    # The proof sees a changed byte: `on` itself forwards otherwise than sent.
    assert len(shadow_differences(shadow, on)) == 3
