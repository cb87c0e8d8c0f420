"""The library's ChatLLM implemented over the configured upstream.

Summary and memory-extraction calls go to `{upstream.base_url}/chat/completions`, non-streaming,
without tools, at a low temperature, with the caller's own credential and an
`X-Compaction-Purpose` header so operators can tell their cost apart. They never reach the client.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from compaction import Message
from compaction.summarize import message_text
from compaction.types import Purpose
from proxy.upstream import post_json


class SummarizerError(Exception):
    """The summarizer's answer could not be used (status, shape)."""


class UpstreamLLM:
    def __init__(
        self,
        client: aiohttp.ClientSession,
        base_url: str,
        *,
        model: str,
        credential: str | None,
        client_headers: dict[str, str],
        timeout_s: float,
    ) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._timeout_s = timeout_s
        # The caller's own credentials (Authorization, or Azure-style keys) and organisation.
        self._headers = {"Content-Type": "application/json", **client_headers}
        if credential:
            self._headers["Authorization"] = credential

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        body = orjson.dumps(
            {
                "model": self._model,
                "messages": messages,
                "temperature": 0.2,
                "max_tokens": max_tokens,
                "stream": False,
            }
        )
        headers = {**self._headers, "X-Compaction-Purpose": purpose}
        status, payload = await post_json(self._client, self._url, body, headers, self._timeout_s)
        if status != 200:
            raise SummarizerError(f"summarizer answered HTTP {status}")
        return _message_text(payload)


def _message_text(payload: Any) -> str:
    try:
        message = payload["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise SummarizerError("summarizer answer has no choices[0].message") from exc
    return message_text(message)
