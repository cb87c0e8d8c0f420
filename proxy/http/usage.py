"""Find the `usage` object of a relayed chat response, cheaply and after the fact.

The probe sees each chunk as it is relayed (it never delays one): a JSON body is kept while it
stays under 1 MiB; an SSE stream keeps only its last 64 KiB, where OpenAI puts the usage chunk
(`stream_options.include_usage`). Parsing happens once, after the response is complete, and
only when the bytes mention `"usage"`. Anything odd gives None.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import orjson

from proxy.http.encodings import decode_body

MAX_JSON_BYTES = 1024 * 1024
_SSE_TAIL_BYTES = 64 * 1024
_MAX_SSE_EVENTS = 8
_USAGE = b'"usage"'


class UsageProbe:
    def __init__(self, content_type: str, content_encoding: str) -> None:
        media = content_type.split(";", 1)[0].strip().lower()
        self._encoding = content_encoding.strip().lower()
        self._sse = media == "text/event-stream"
        self._json = media == "application/json" or media.endswith("+json")
        self._parts: deque[bytes] = deque()
        self._size = 0
        self._gave_up = not (self._sse or self._json)

    def feed(self, chunk: bytes) -> None:
        if self._gave_up:
            return
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._sse:
            while self._size - len(self._parts[0]) >= _SSE_TAIL_BYTES:
                self._size -= len(self._parts.popleft())
        elif self._size > MAX_JSON_BYTES:
            self._gave_up = True
            self._parts.clear()

    def usage(self) -> dict[str, Any] | None:
        if self._gave_up or not self._parts:
            return None
        data = decode_body(b"".join(self._parts), self._encoding)
        if data is None or _USAGE not in data:
            return None
        return _from_sse(data) if self._sse else _from_json(data)


def _usage_of(document: Any) -> dict[str, Any] | None:
    if isinstance(document, dict):
        usage = document.get("usage")
        if isinstance(usage, dict):
            return usage
    return None


def _from_json(data: bytes) -> dict[str, Any] | None:
    try:
        return _usage_of(orjson.loads(data))
    except orjson.JSONDecodeError:
        return None


def _from_sse(data: bytes) -> dict[str, Any] | None:
    tried = 0
    for line in reversed(data.splitlines()):
        if not line.startswith(b"data:") or _USAGE not in line:
            continue
        tried += 1
        try:
            usage = _usage_of(orjson.loads(line[5:].strip()))
        except orjson.JSONDecodeError:
            usage = None
        if usage is not None or tried >= _MAX_SSE_EVENTS:
            return usage
    return None
