"""Server-sent events as the dialects' stream readers see them: a body cut into events, an
event's data, an event written back, and what the three readers keep alike (the first
response's usage, the usage of the rounds before the response being read and of that response,
and per response the client's own calls counted and whether its finish is withheld)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import orjson

from proxy.dialects.base import JsonObject

_DATA = b"data:"


async def read_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The server-sent events of a body as they arrive, each with its blank-line end."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\r" in pending:
            pending = pending.replace(b"\r\n", b"\n")
        while True:
            end = pending.find(b"\n\n")
            if end < 0:
                break
            yield pending[: end + 2]
            pending = pending[end + 2 :]
    if pending.strip():
        yield pending if pending.endswith(b"\n\n") else pending.rstrip(b"\n") + b"\n\n"


def event_data(event: bytes) -> bytes | None:
    """The `data` of an event (its lines joined), None when it has none."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(_DATA)]
    return b"\n".join(lines) if lines else None


def typed_payload(event: bytes) -> dict[str, Any] | None:
    """An event's data as a JSON object with a string `type` (Responses and Anthropic events);
    None for anything else, which the readers pass on untouched."""
    data = event_data(event)
    if data is None:
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) and isinstance(payload.get("type"), str) else None


def named_event(name: str, payload: JsonObject) -> bytes:
    """An event with its name and its data."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def data_event(payload: JsonObject) -> bytes:
    """An event with data only."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class StreamReader:
    """What the three readers keep alike: the first response's usage, the usage of the rounds
    before the response being read and of that response, and per response the client's own
    calls counted and whether its finish is withheld."""

    def __init__(self, tool: str) -> None:
        self._tool = tool
        """The tool whose calls are withheld from the client."""
        self._first_usage: object = None
        self._prior: object = None
        """Usage of the rounds before this response (added to the one the client sees)."""
        self.begin()

    def begin(self) -> None:
        self._clients = 0
        self._spent: object = None
        self._holding = False

    @property
    def others(self) -> int:
        return self._clients

    @property
    def usage(self) -> object:
        return self._first_usage

    @property
    def spent(self) -> object:
        return self._spent
