"""A real coding trajectory replayed through the proxy in the Responses and Anthropic shapes
(bench.dialects converts it): every request valid for that API, under the window, one summary
per growth step, and the forwarded prefix byte-stable between compactions."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.corpus import read_corpus
from bench.dialects import WIRES
from bench.replay import requests_of, summary_of
from compaction.marker import PREVIEW_MARK
from proxy.http import keys
from tests.fakes.script import Script


@pytest.mark.parametrize("dialect", ["responses", "anthropic"])
async def test_a_coding_trajectory_replays_valid_and_within_the_window(
    start: Any, upstream: Any, script: Script, client: Any, corpus_dir: Path, dialect: str
) -> None:
    wire = WIRES[dialect]
    window = 8000
    proxy = await start(
        upstream={"anthropic_base_url": upstream.base_url},
        models={"default_context_window": window},
        compaction={"keep_recent_rounds": 5, "summary_max_tokens": 2000},
    )
    conversations = list(read_corpus(corpus_dir / "swe_mini_gemini3pro_toolcalls.jsonl"))
    conversations.sort(key=lambda c: len(c["messages"]))
    trajectory = conversations[len(conversations) * 3 // 4]
    prefixes = requests_of(trajectory["messages"])
    headers = {"X-Session-Id": "replay", "Authorization": "Bearer sk-replay"}
    for prefix in prefixes:
        body = orjson.dumps(wire.body(prefix, trajectory["tools"]))
        async with client.post(f"{proxy.url}/v1/{wire.path}", data=body, headers=headers) as r:
            assert r.status == 200

    sent = [request.json() for request in script.calls(None)]
    assert len(sent) == len(prefixes)
    assert script.problems == []
    assert all(wire.tokens(body) <= window for body in sent)
    summaries = len(script.calls("summary"))
    first, last = (
        wire.tokens(wire.body(p, trajectory["tools"])) for p in (prefixes[0], prefixes[-1])
    )
    assert 1 <= summaries <= 2 + (last - first) // int(window * 0.1)
    previewing = sum(
        record["path"] == "selective" for record in proxy.app[keys.RECORDS].get("replay")["records"]
    )
    changes = 0
    for before, after in itertools.pairwise(sent):
        old, new = wire.items(before), wire.items(after)
        if summary_of(old) != summary_of(new) or _previews(old) != _previews(new):
            changes += 1  # a compaction: a new summary, or more outputs cut to previews
            continue
        assert new[: len(old) - 1] == old[:-1]  # byte-stable between compactions
    assert changes <= summaries + previewing


def _previews(items: list[Any]) -> int:
    return sum(PREVIEW_MARK in orjson.dumps(item).decode() for item in items)
