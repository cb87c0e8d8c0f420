"""Find the `usage` object of a relayed response, cheaply and after the fact.

The probe sees each chunk as it is relayed (it never delays one): a JSON body is kept while it
stays under 1 MiB; an SSE stream keeps only its first 16 KiB and its last 64 KiB, where the APIs
put their usage (in the last chunk or event, or near the first); where in a document or an event
the `usage` sits is the dialects' (proxy.dialects.usage_of). An event longer than the tail
(Responses' last event repeats the whole response) has its usage read from its end.
Usage found in several events is merged, later fields winning. Parsing happens
once, after the response is complete, and only when the bytes mention `"usage"`. Anything odd
gives None.
"""

from __future__ import annotations

import json
from collections import deque

import orjson

from proxy.dialects import usage_of
from proxy.http.encodings import decode_body
from proxy.interception import Usage

MAX_JSON_BYTES = 1024 * 1024
_SSE_TAIL_BYTES = 64 * 1024
_SSE_HEAD_BYTES = 16 * 1024
_MAX_SSE_EVENTS = 8
_USAGE = b'"usage"'
_USAGE_KEY = b'"usage":'
_DECODER = json.JSONDecoder()


class UsageProbe:
    def __init__(self, content_type: str, content_encoding: str) -> None:
        media = content_type.split(";", 1)[0].strip().lower()
        self._encoding = content_encoding.strip().lower()
        self._sse = media == "text/event-stream"
        self._json = media == "application/json" or media.endswith("+json")
        self._parts: deque[bytes] = deque()
        self._head = b""
        self._size = 0
        self._gave_up = not (self._sse or self._json)

    def feed(self, chunk: bytes) -> None:
        if self._gave_up:
            return
        if self._sse and not self._encoding and len(self._head) < _SSE_HEAD_BYTES:
            self._head += chunk[: _SSE_HEAD_BYTES - len(self._head)]
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._sse:
            while self._size - len(self._parts[0]) >= _SSE_TAIL_BYTES:
                self._size -= len(self._parts.popleft())
        elif self._size > MAX_JSON_BYTES:
            self._gave_up = True
            self._parts.clear()

    def usage(self) -> Usage | None:
        if self._gave_up or not self._parts:
            return None
        data = decode_body(b"".join(self._parts), self._encoding)
        if data is None or (_USAGE not in data and _USAGE not in self._head):
            return None
        if not self._sse:
            return _from_json(data)
        # Oldest first, later fields winning; in a short stream head and tail overlap, and an
        # event seen twice merges to the same.
        head = self._head.rsplit(b"\n\n", 1)[0].splitlines()
        found = [*_from_sse(head), *_from_sse(data.splitlines()[::-1])[::-1]]
        merged: Usage = {}
        for usage in found:
            merged.update({key: value for key, value in usage.items() if value is not None})
        return merged or None


def _from_json(data: bytes) -> Usage | None:
    try:
        return usage_of(orjson.loads(data))
    except orjson.JSONDecodeError:
        return None


def _from_sse(lines: list[bytes]) -> list[Usage]:
    """The usage objects of the first few events of `lines` that mention one, in that order."""
    found: list[Usage] = []
    tried = 0
    for line in lines:
        if _USAGE not in line:
            continue
        tried += 1
        if line.startswith(b"data:"):
            try:
                usage = usage_of(orjson.loads(line[5:].strip()))
            except orjson.JSONDecodeError:
                usage = None
        else:
            usage = _usage_in_fragment(line)
        if usage is not None:
            found.append(usage)
        if tried >= _MAX_SSE_EVENTS:
            break
    return found


def _usage_in_fragment(fragment: bytes) -> Usage | None:
    """The usage object in the end of an event whose start fell out of the tail kept: Responses'
    `response.completed` repeats the whole output, instructions and tools, and can be far longer
    than the tail, but its `usage` comes last. A `"usage":` followed by an object can only be a
    key there (inside a JSON string its quotes would be escaped), so the last one is decoded."""
    start = fragment.rfind(_USAGE_KEY)
    if start < 0:
        return None
    text = fragment[start + len(_USAGE_KEY) :].decode("utf-8", "replace").lstrip()
    try:
        usage, _ = _DECODER.raw_decode(text)
    except ValueError:
        return None
    return usage if isinstance(usage, dict) else None
