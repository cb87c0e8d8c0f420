"""`compaction.summarizer: native`: Anthropic's on-demand compaction as the proxy's summarizer,
against the strict fake (tests/fakes/anthropic_strict.py), which issues signed `compaction`
blocks and checks them as the platform docs say (`build-with-claude/compaction-on-demand`: the
block first in `messages`, exactly as returned, with the beta `compact-2026-09-04` on every
request carrying it; `.../compaction-keep-recent-turns`; `.../compaction-thinking-blocks`: the
kept turns' thinking stays valid while they follow the summarized messages unchanged and
`system` and `tools` stay the same).

The readable share: of the thinking blocks the client's request holds in the turns a compacted
request keeps, the share the fake read as valid. Measured for both summarizers on the same
Claude Code-shaped loop (docs/dialects.md carries the figures)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from compaction import SUMMARY_MARKER
from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.dialects.anthropic.native import ON_DEMAND
from tests.fakes.anthropic_strict import COMPACTION_BETA, StrictAnthropic
from tests.fakes.script import body_tokens
from tests.proxy.compacting.conftest import small_window_proxies
from tests.proxy.compacting.test_preserved_thinking import (
    BOUND_MODEL,
    OLDER_MODEL,
    WINDOW,
    claude_code_body,
    send,
    tool_loop,
)
from tests.proxy.conftest import RunningProxy, StartProxy


@pytest.fixture
async def api() -> AsyncIterator[StrictAnthropic]:
    async with StrictAnthropic(window=WINDOW) as fake:
        yield fake


@pytest.fixture
def start(start_proxy: StartProxy, tmp_path: Path) -> Callable[..., Awaitable[RunningProxy]]:
    return small_window_proxies(start_proxy, tmp_path, recall="on")


async def proxy_with(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    summarizer: str,
    **compaction: Any,
) -> RunningProxy:
    return await start(
        upstream={"anthropic_base_url": api.base_url},
        models={"default_context_window": WINDOW},
        compaction={
            "summary_max_tokens": 1000,
            "keep_recent_rounds": 2,
            "strategy": "summary",
            "summarizer": summarizer,
            **compaction,
        },
    )


def kept_thinking(client: list[Any], forwarded: dict[str, Any]) -> int:
    """The thinking blocks of the client's turns that `forwarded` keeps (found by their tool
    calls' ids, which no summary repeats)."""
    kept = {
        b["id"]
        for m in forwarded["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    }
    return sum(
        sum(b["type"] == "thinking" for b in m["content"])
        for m in client
        if m["role"] == "assistant"
        and any(b.get("type") == "tool_use" and b["id"] in kept for b in m["content"])
    )


async def readable_share(
    client: aiohttp.ClientSession, proxy: RunningProxy, api: StrictAnthropic, turns: int
) -> tuple[int, int, int]:
    """Drive the loop one request at a time: the compacted requests, the client's thinking
    blocks in the turns they kept, and of those the ones the model read."""
    messages: list[Any] = []
    compacted = kept = readable = 0
    for _ in range(turns):
        before = [dict(m) for m in messages]
        seen = await tool_loop(client, proxy, BOUND_MODEL, 1, messages=messages)
        assert seen[0][0] == 200
        if seen[0][1].get("x-compaction-status") in ("applied", "reused"):
            compacted += 1
            kept += kept_thinking(before or messages[:1], api.requests[-1])
            readable += api.reads[-1][1]
    return compacted, kept, readable


async def test_a_native_compaction_leads_with_the_block_and_keeps_the_kept_thinking_readable(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    proxy = await proxy_with(start, api, "native")
    seen = await tool_loop(client, proxy, BOUND_MODEL, 70)
    assert [status for status, _ in seen] == [200] * 70
    assert api.refused == []  # block first, byte-exact, with its beta; no thinking refused
    assert api.compactions >= 2  # compacted in a loop: a later block folds the earlier one
    asked = [call for call in api.own_calls if call.get("compaction") is not None]
    assert len(asked) == api.compactions
    for call in asked:  # the conversation's own system and tools
        assert call["system"] == api.requests[0]["system"]
        assert call["tools"] == api.requests[0]["tools"]
    by_compaction: dict[str, list[dict[str, Any]]] = {}
    for (_, headers), request in zip(seen, api.requests, strict=True):
        if headers.get("x-compaction-status") in ("applied", "reused"):
            by_compaction.setdefault(headers["x-compaction-id"], []).append(request)
    assert len(by_compaction) >= 2
    for requests in by_compaction.values():
        first = requests[0]
        for request in requests:
            assert request["messages"][0]["content"][0]["type"] == "compaction"
            assert [t["name"] for t in request["tools"]] == ["Bash", "Read"]  # no recall tool
            # Reused byte-stable: the block and the kept turns as the first request sent them.
            assert request["messages"][: len(first["messages"])] == first["messages"]
    # Every thinking block of the kept turns was sent back and read.
    assert api.readable == api.received > 0


async def test_a_streamed_loop_with_compactions_prepared_ahead_is_compacted_natively(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    # A reserve prepared in the background goes out later, on another request: still the
    # block first, with its beta, and the kept thinking read.
    proxy = await proxy_with(start, api, "native", precompute_ratio=0.6)
    seen = await tool_loop(client, proxy, BOUND_MODEL, 60, stream=True)
    assert [status for status, _ in seen] == [200] * 60
    assert api.refused == [] and api.compactions >= 2
    assert api.requests[-1]["messages"][0]["content"][0]["type"] == "compaction"
    assert api.readable == api.received > 0


@pytest.mark.parametrize("summarizer", ["text", "native"])
async def test_the_readable_share_of_kept_thinking(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
    summarizer: str,
) -> None:
    proxy = await proxy_with(start, api, summarizer)
    compacted, kept, readable = await readable_share(client, proxy, api, 70)
    own = sum(body_tokens("/v1/messages", call) for call in api.own_calls)
    agent = sum(body_tokens("/v1/messages", request) for request in api.requests)
    print(f"\nsummarizer={summarizer}: {compacted} compacted requests, "
          f"{readable} of {kept} kept thinking blocks readable; summary calls "
          f"{len(api.own_calls)} ({own} prompt tokens), agent prompts {agent} tokens")  # fmt: skip
    assert compacted >= 10 and kept > 0
    assert api.refused == []
    if summarizer == "native":
        assert readable == kept
    else:
        assert readable < kept  # the stale ones are removed: only what follows is read


@pytest.mark.parametrize("model", [OLDER_MODEL, BOUND_MODEL])
async def test_a_failed_native_compaction_falls_back_to_the_text_summary(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
    model: str,
) -> None:
    proxy = await proxy_with(start, api, "native")
    api.compacts = False  # the compaction request is refused: the text summary goes
    seen = await tool_loop(client, proxy, model, 50)
    assert [status for status, _ in seen] == [200] * 50
    assert [r.purpose for r in api.refused] == ["summary"]  # asked once, then the text
    async with client.get(f"{proxy.url}/metrics") as response:
        assert "compaction_proxy_summarizer_failures_total 1.0" in await response.text()
    assert seen[-1][1]["x-compaction-status"] in ("applied", "reused")
    last = api.requests[-1]
    assert last["messages"][0]["content"][0]["type"] == "text"  # the text summary
    assert "recall" not in [t["name"] for t in last["tools"]]  # tools stay as sent


async def test_an_account_without_native_compaction_is_not_asked_again_after_three_failures(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    # Five conversations, each compacted: the first three ask and fail (failure_threshold 3),
    # the other two go straight to the text summary while the cooldown lasts.
    proxy = await proxy_with(start, api, "native")
    api.compacts = False
    for session in range(5):
        seen = await tool_loop(client, proxy, BOUND_MODEL, 50, session=f"cc-{session}")
        assert [status for status, _ in seen] == [200] * 50
        assert seen[-1][1]["x-compaction-status"] in ("applied", "reused")
    assert [r.purpose for r in api.refused] == ["summary"] * 3


async def test_a_request_carrying_the_block_goes_with_the_beta_and_the_clients_own_betas(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    proxy = await proxy_with(start, api, "native")
    messages: list[Any] = []
    await tool_loop(client, proxy, BOUND_MODEL, 50, messages=messages)
    assert api.compactions >= 1
    body = claude_code_body(BOUND_MODEL, messages)
    beta = {"anthropic-beta": "interleaved-thinking-2025-05-14", "X-Session-Id": "cc-1"}
    status, headers, _ = await send(client, proxy.url, body, **beta)
    assert status == 200 and headers["x-compaction-status"] in ("applied", "reused")
    assert api.refused == []
    assert api.betas[-1] == {"interleaved-thinking-2025-05-14", COMPACTION_BETA}


def test_the_block_goes_first_as_its_own_turn_or_leads_the_first_kept_assistant_turn() -> None:
    block = {"type": "compaction", "content": "The user fixes tests.", "signature": "cmp-1"}
    summary = ON_DEMAND.carrying({"role": "user", "content": "[summary]"}, block)
    user = {"role": "user", "content": [{"type": "text", "text": "Go on."}]}
    said = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    assert ANTHROPIC_MESSAGES.wire([summary, user, said]) == [
        {"role": "assistant", "content": [block]},
        user,
        said,
    ]
    wired = ANTHROPIC_MESSAGES.wire([summary, said, user])
    assert wired == [{"role": "assistant", "content": [block, *said["content"]]}, user]
    assert wired[1] is user  # kept turns are the client's own objects
    # Without a native summary: the text summary joins the user turn after it, as before.
    text = {"role": "user", "content": f"{SUMMARY_MARKER}\nEarlier."}
    assert ANTHROPIC_MESSAGES.wire([text, user])[0]["role"] == "user"
    assert ON_DEMAND.has_native([summary, user]) and not ON_DEMAND.has_native([user, summary])
    # An empty assistant text is no block (the API refuses an empty text block).
    empty = {"role": "assistant", "content": ""}
    assert ANTHROPIC_MESSAGES.wire([summary, empty]) == [{"role": "assistant", "content": [block]}]


def test_the_clients_betas_on_several_header_lines_are_all_kept() -> None:
    lines = CIMultiDictProxy(CIMultiDict([("anthropic-beta", "a-1"), ("Anthropic-Beta", "b-2")]))
    assert ON_DEMAND.request_headers(lines) == {"anthropic-beta": f"a-1,b-2,{COMPACTION_BETA}"}
    assert ON_DEMAND.request_headers({"anthropic-beta": "a-1"}) == {
        "anthropic-beta": f"a-1,{COMPACTION_BETA}"
    }


async def test_an_older_model_is_compacted_natively_too(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    # No prefix check: the remembered request's bytes are spliced (the fast path) and still
    # carry the block first, with its beta.
    proxy = await proxy_with(start, api, "native")
    seen = await tool_loop(client, proxy, OLDER_MODEL, 60)
    assert [status for status, _ in seen] == [200] * 60
    assert api.refused == [] and api.compactions >= 1
    statuses = [h.get("x-compaction-status") for _, h in seen]
    assert "reused" in statuses
    assert api.requests[-1]["messages"][0]["content"][0]["type"] == "compaction"
    assert all(COMPACTION_BETA in betas for betas in api.betas[statuses.index("applied") :])
    # While a compaction is reused its turns go out as when it applied (the prompt cache's
    # prefix): the block in the same turn, the turns after it the same.
    assert len(api.requests) == len(seen)
    first: dict[str, Any] = {}
    for (_, headers), sent in zip(seen, api.requests, strict=True):
        if headers.get("x-compaction-status") in ("applied", "reused"):
            lead = first.setdefault(headers["x-compaction-id"], sent["messages"][:2])
            assert sent["messages"][:2] == lead


async def test_a_clients_own_compaction_request_goes_as_sent_with_native_on(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    proxy = await proxy_with(start, api, "native")
    messages: list[Any] = []
    await tool_loop(client, proxy, BOUND_MODEL, 46, messages=messages)
    own = len(api.own_calls)
    messages[-1]["content"].append({"type": "text", "text": "Compact now."})
    thinking = {"type": "enabled", "budget_tokens": 2000}
    body = claude_code_body(
        BOUND_MODEL, messages, compaction={"type": "summarize"}, max_tokens=4000, thinking=thinking
    )
    beta = {"anthropic-beta": COMPACTION_BETA, "X-Session-Id": "cc-1"}
    status, headers, _ = await send(client, proxy.url, body, **beta)
    assert status == 200 and headers["x-compaction-status"] == "skipped"
    assert api.requests[-1] == body  # byte-identical: nothing folded, no tool added
    assert len(api.own_calls) == own
