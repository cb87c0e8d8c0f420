"""bench.cost: its modelled prompt caches bill as the providers document, and its quick run over
the corpus gives figures that add up."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.cost import (
    BLOCK_TOKENS,
    DEFAULT_PRICE,
    TTL_S,
    Pace,
    PromptCache,
    direct_paced,
    mark_last_turn,
    run,
)
from bench.dialects import WIRES, to_anthropic
from tests import factories as f


def chat(messages: list[Any]) -> dict[str, Any]:
    return {"model": "replay", "messages": messages}


def long_history(rounds: int = 40) -> list[Any]:
    return f.agent_conversation(rounds=rounds, blocks=2, output_chars=400)


def test_a_repeated_prefix_is_read_in_whole_blocks_within_the_ttl() -> None:
    cache = PromptCache(WIRES["chat"], DEFAULT_PRICE)
    history = long_history()
    first = cache.bill(chat(history), 10, now=0)
    assert first.cached_tokens == 0 and first.prompt_tokens > 4 * BLOCK_TOKENS
    again = cache.bill(chat([*history, f.user("and now?")]), 10, now=60)
    assert again.cached_tokens % BLOCK_TOKENS == 0
    assert first.prompt_tokens - BLOCK_TOKENS < again.cached_tokens <= first.prompt_tokens
    assert again.dollars < first.dollars
    late = cache.bill(chat([*history, f.user("later")]), 10, now=60 + TTL_S + 1)
    assert late.cached_tokens == 0  # expired


def test_a_changed_early_message_breaks_the_cache_from_there() -> None:
    cache = PromptCache(WIRES["chat"], DEFAULT_PRICE)
    history = long_history()
    cache.bill(chat(history), 10, now=0)
    edited = [history[0], f.user("something else"), *history[2:]]
    assert cache.bill(chat(edited), 10, now=1).cached_tokens == 0


def test_anthropic_reads_the_prefix_written_at_the_last_breakpoint() -> None:
    cache = PromptCache(WIRES["anthropic"], DEFAULT_PRICE)
    history = [*long_history(), f.user("go on")]
    first = cache.bill(mark_last_turn(to_anthropic(history, None)), 10, now=0)
    assert first.cached_tokens == 0 and first.written_tokens > 0
    grown = [*history, f.assistant("done"), f.user("next")]
    second = cache.bill(mark_last_turn(to_anthropic(grown, None)), 10, now=10)
    assert second.cached_tokens >= first.written_tokens
    unmarked = PromptCache(WIRES["anthropic"], DEFAULT_PRICE)
    body = to_anthropic(history, None)
    body.pop("system")  # no breakpoint at all: nothing is cached
    unmarked.bill(body, 10, now=0)
    assert unmarked.bill(body, 10, now=1).cached_tokens == 0


async def test_the_quick_run_replays_the_corpus_and_its_figures_add_up(corpus_dir: Path) -> None:
    args = argparse.Namespace(
        quick=True,
        windows=[8000],
        per_source=1,
        turn_s=20.0,
        time_scale=0.001,  # quick; the figures asserted here do not depend on the pace
        pace="sequential",
        sources=None,
        dialect="chat",
        config=None,
        set=[],
    )
    [(title, outcome)] = await run(args)
    assert "window 8000" in title
    rows = list(outcome.by_source.values())
    assert rows and all(row.direct.dollars > 0 and row.proxied > 0 for row in rows)
    for row in [*rows, outcome.compacting]:
        assert row.agent.cached_tokens <= row.agent.prompt_tokens
        assert row.direct.cached_tokens <= row.direct.prompt_tokens
        assert 0 <= row.own_share < 1
        # The agent's own answers are the same direct and through the proxy.
        assert row.agent.output_tokens == row.direct.output_tokens
    total = sum(row.direct.dollars for row in rows)
    split = outcome.compacting.direct.dollars + outcome.quiet.direct.dollars
    assert abs(total - split) < 1e-9
    # At 8k both conversations compact: fewer tokens forwarded, the proxy's own calls billed.
    assert outcome.compacting.conversations == 2
    assert outcome.compacting.agent.prompt_tokens < outcome.compacting.direct.prompt_tokens
    assert outcome.compacting.own.requests > 0


def test_the_paced_direct_replay_bills_every_conversation_in_the_order_requests_arrive() -> None:
    """Two conversations at once: each request is billed at its own step's time, so a prefix
    the other conversation shares is read from the cache only once it was written."""
    pace = Pace(unit_modelled_s=5.0)  # a step of 4 units: 20 s of the cache's clock
    shared = long_history(rounds=20)
    one = {"id": "one", "messages": [*shared, f.user("first")]}
    two = {"id": "two", "messages": [*shared, f.user("second"), f.assistant("ok"), f.user("3")]}
    ledger = direct_paced(WIRES["chat"], DEFAULT_PRICE, {"file": [one, two]}, pace)
    first, second = ledger.bills["one", "agent"], ledger.bills["two", "agent"]
    assert first.requests >= 1 and second.requests >= 1
    # Both open with the same history at time 0: whichever is billed second reads it cached.
    assert first.cached_tokens + second.cached_tokens > 0


async def test_the_paced_run_replays_conversations_at_once_and_bills_the_proxy_s_own_calls(
    corpus_dir: Path,
) -> None:
    args = argparse.Namespace(
        quick=True,
        windows=[8000],
        per_source=1,
        pace="agent",
        sources=None,
        unit_s=0.005,  # quick; what is asserted does not depend on the pace
        turn_units=3.0,
        tool_units=1.0,
        own_units=6.0,
        unit_modelled_s=5.0,
        turn_s=20.0,
        time_scale=0.001,
        dialect="chat",
        config=None,
        set=[],
    )
    [(_, outcome)] = await run(args)
    rows = list(outcome.by_source.values())
    assert len(rows) == 2 and all(row.direct.dollars > 0 and row.proxied > 0 for row in rows)
    for row in rows:
        assert row.agent.output_tokens == row.direct.output_tokens
        assert row.agent.requests == row.direct.requests  # every request reached the upstream
    # The proxy's own calls, made while both conversations ran, are each billed to its own.
    assert outcome.compacting.conversations == 2
    assert all(row.own.requests > 0 for row in rows)
