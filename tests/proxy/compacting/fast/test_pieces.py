"""Large bodies parsed in pieces (proxy.compacting.fast.pieces): the value the whole parse gives, or
None (then the whole parse decides), whatever the body holds; through the proxy, a request like
any other."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.corpus import read_corpus
from bench.dialects import to_anthropic, to_responses
from proxy.compacting.fast.pieces import _BETWEEN_ITEMS, PIECES_FROM_BYTES, by_pieces, parse_steps
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import conversation_of

PIECE = 512  # small pieces: many cuts in small bodies


def _parsed(body: bytes, items_key: str, *, piece_bytes: int) -> dict[str, Any] | None:
    return asyncio.run(by_pieces(body, items_key, piece_bytes=piece_bytes))


def _bodies(messages: list[dict[str, Any]], tools: list[Any] | None) -> list[tuple[str, Any]]:
    chat = {"model": "m", "messages": messages, **({"tools": tools} if tools else {})}
    return [
        ("messages", chat),
        ("messages", to_anthropic(messages, tools)),
        ("input", to_responses(messages, tools)),
    ]


def test_corpus_bodies_in_every_dialect_and_layout_parse_to_the_whole_parse(
    corpus_dir: Path,
) -> None:
    checked = cut = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in list(read_corpus(path))[:3]:
            for key, payload in _bodies(conversation["messages"], conversation.get("tools")):
                for body in (orjson.dumps(payload), json.dumps(payload, indent=2).encode()):
                    pieces = _parsed(body, key, piece_bytes=PIECE)
                    assert pieces == orjson.loads(body)
                    checked += 1
                    cut += len(body) > 4 * PIECE
    assert checked > 50 and cut > 40


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "a"} {"role": "b"}]}',  # a comma missing
        b'{"messages": [,{"role": "a"}]}',
        b'{"messages": [{"role": "a"},]}',
        b'{"messages": [{"role": "a"},,{"role": "b"}]}',
        b'{"messages": [{"role": "a"}]}trailing',
        b'{"messages": [\x0b{"role": "a"}]}',  # a vertical tab is no JSON whitespace
        b'{"messages": [{"role": 1e999999}]}',  # orjson refuses it; the whole parse decides
        b'{"messages": [], "messages": [{"role": "a"}]}',  # the second is the one kept
        # The second, a string: the text other_fields put in the list's place (now drawn anew).
        b'{"messages": [{"role": "a"}], "messages": "\\u0000compaction-proxy: the list\\u0000"}',
        b'{"messages": {"role": "a"}}',
        b'[{"messages": []}]',
        b'{"messages": [{"role": "a"}], [{"b": 1},{"role": "c"}]}',  # a piece is one array
        # Nested a level past what orjson reads (1024): in a piece of its own, one level less
        # deep, it read (and every compaction of the conversation failed with a traceback).
        b'{"messages": [{"role": "a", "content": ' + b"[" * 1022 + b"]" * 1022 + b"}]}",
    ],
)
def test_what_the_whole_parse_refuses_or_reads_otherwise_is_not_read_in_pieces(
    body: bytes,
) -> None:
    assert _parsed(body, "messages", piece_bytes=1) is None


def test_cuts_that_fall_inside_an_item_or_a_string_still_give_the_whole_value() -> None:
    nested = {"role": "user", "content": [{"role": "x"}, {"role": "y"}, {"role": "z"}]}
    quoted = {"role": "tool", "content": 'a},{"role": "b"}, {"role":' * 40}
    messages = [nested, quoted, {"role": "assistant", "content": "ok"}] * 20
    # After the list, a place that reads as a cut too.
    body = orjson.dumps({"model": "m", "messages": messages, "tail": [{"a": 1}, {"role": 1}]})
    assert _parsed(body, "messages", piece_bytes=8) == orjson.loads(body)


_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=8)  # no lone surrogate
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), _TEXT)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["role", "content", "x"]), inner, max_size=3),
    ),
    max_leaves=12,
)
_TYPES = st.sampled_from(["message", "function_call", "function_call_output", "input_text"])
_ITEMS = st.lists(
    st.one_of(
        _VALUES,
        st.fixed_dictionaries({"role": _VALUES}),
        st.fixed_dictionaries({"type": _TYPES, "content": _VALUES}),
    ),
    max_size=12,
)


@given(items=_ITEMS, indent=st.sampled_from([None, 1]), piece=st.integers(1, 64))
def test_any_list_parses_in_pieces_to_the_whole_parse(
    items: list[Any], indent: int | None, piece: int
) -> None:
    after = [{"x": 1}, {"role": 2}]  # reads as a place to cut, past the list
    body = json.dumps({"a": 1, "messages": items, "z": after}, indent=indent).encode()
    assert _parsed(body, "messages", piece_bytes=piece) == orjson.loads(body)


async def test_a_body_of_megabytes_is_compacted_as_any_other(
    start: Any, script: Script, client: Any
) -> None:
    # Past a megabyte the hook parses the body in pieces, other requests served in between: the
    # same request, the same compaction and the same bytes forwarded for what is kept.
    proxy = await start(models={"default_context_window": 500_000})
    messages = conversation_of(440_000)
    body = json.dumps({"model": "gpt-test", "messages": messages}, indent=1).encode()
    assert len(body) > PIECES_FROM_BYTES
    assert await _status(client, proxy, body) == "applied"
    forwarded = script.calls(None)[-1].body
    assert orjson.loads(forwarded)["messages"][-3:] == messages[-3:]
    last = json.dumps(messages[-1], indent=1).replace("\n", "\n  ").encode()
    assert last in body and last in forwarded  # kept as the client wrote it


async def test_a_body_of_megabytes_that_is_not_json_goes_out_untouched(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(models={"default_context_window": 500_000})
    body = orjson.dumps({"model": "gpt-test", "messages": conversation_of(440_000)})
    broken = body[:-1] + b",}"  # a trailing comma
    assert await _status(client, proxy, broken) == "none"
    assert script.calls(None)[-1].body == broken  # the upstream says what is wrong with it


async def _status(client: Any, proxy: Any, body: bytes) -> str:
    """Post `body` (a stream: aiohttp warns of a large bytes body); its compaction status."""
    headers = {"Authorization": "Bearer sk", "X-Session-Id": "megabytes"}
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=io.BytesIO(body), headers=headers
    ) as response:
        assert response.status == 200
        return str(response.headers["x-compaction-status"])


def test_an_item_no_piece_can_parse_costs_a_few_parses_of_the_body() -> None:
    # A lone surrogate (see splice.load_json) fails every piece that holds it. Each failed piece
    # was grown by one item and parsed again: a 4 MiB body took seconds, 8 MiB half a minute,
    # holding the GIL all along (and the event loop's thread, on a retry's parse).
    messages = [{"role": "user", "content": "x" * 1000} for _ in range(4000)]
    messages[10]["content"] += "\ud83d"
    body = json.dumps({"model": "m", "messages": messages}).encode()
    steps = parse_steps(body, "messages", piece_bytes=PIECES_FROM_BYTES)
    parsed = 0  # the step yields once a piece is parsed
    while True:
        try:
            next(steps)
        except StopIteration as done:
            assert done.value is None  # the whole parse decides
            break
        parsed += 1
    assert parsed < 8  # doubling from 1 MiB to the 4 MiB body; grown by items, thousands


def test_a_body_of_every_dialect_has_places_to_cut() -> None:
    # Responses' items open with their "type" (as Codex writes them, and bench.dialects): cut
    # only before a "role", such a body had no place to cut and was parsed in one call, the
    # GIL held throughout.
    messages = conversation_of(20_000)
    for key, payload in _bodies(messages, None):
        body = orjson.dumps(payload)
        assert len(_BETWEEN_ITEMS.findall(body)) > len(messages) / 2, key
