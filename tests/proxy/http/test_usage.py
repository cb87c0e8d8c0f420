"""The usage probe finds each API's usage where that API puts it, also in long streams."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.http.usage import UsageProbe
from tests.fakes.apis import anthropic_events, responses_events, responses_object
from tests.fakes.upstream import chat_chunk, sse_events


def probe(chunks: list[bytes], content_type: str = "text/event-stream") -> dict[str, Any] | None:
    found = UsageProbe(content_type, "")
    for chunk in chunks:
        found.feed(chunk)
    return found.usage()


def filler(count: int) -> list[bytes]:
    """Events that mention `"usage": null`, as chat chunks do with include_usage."""
    return sse_events(*({"x": "y" * 500, "usage": None} for _ in range(count)), done=False)


def test_a_chat_stream_gives_its_last_chunks_usage() -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
    chunks = filler(300) + sse_events(chat_chunk("hi"), chat_chunk(None, usage=usage))
    assert probe(chunks) == usage


def test_a_responses_body_and_stream_give_input_tokens() -> None:
    assert probe([orjson.dumps(responses_object("a", input_tokens=42))], "application/json") == {
        "input_tokens": 42,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 44,
    }
    found = probe(responses_events("streamed", input_tokens=43))
    assert found is not None and found["input_tokens"] == 43


def test_a_long_anthropic_stream_keeps_the_input_tokens_of_its_first_event() -> None:
    events = anthropic_events("streamed answer", input_tokens=99)
    chunks = [events[0], *filler(300), *events[1:]]
    assert probe(chunks) == {
        "input_tokens": 99,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 2,
    }


def test_a_responses_stream_whose_completed_event_is_long_still_gives_its_usage() -> None:
    # response.completed repeats the whole output (and instructions, tools): past the tail kept,
    # its `data:` start is gone, but its usage, at the end, is still read.
    events = responses_events("x" * 100_000, input_tokens=4321)
    assert len(events[-1]) > 64 * 1024
    stream = b"".join(events)
    found = probe([stream[i : i + 16384] for i in range(0, len(stream), 16384)])
    assert found is not None and found["input_tokens"] == 4321
