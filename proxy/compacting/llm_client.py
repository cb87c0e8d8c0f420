"""The library's ChatLLM implemented over the configured upstream.

Summary and memory-extraction calls go to `{upstream.base_url}/chat/completions`, non-streaming,
without tools, at a low temperature (where the model allows one), with the caller's own
credential and an `X-Compaction-Purpose` header so operators can tell their cost apart. They
never reach the client.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson

from compaction import Message
from compaction.summarize import message_text
from compaction.types import Purpose
from proxy.http.upstream import post_json

_ADAPTABLE = ("max_tokens", "temperature")
_REFUSAL = re.compile(r"Unsupported (?:parameter|value): '(\w+)'")


class SummarizerError(Exception):
    """The summarizer's answer could not be used (status, shape)."""


class ModelParameters:
    """What each summary model accepts, learned from the upstream's own 400 answers.

    Reasoning models (OpenAI's o-series and later) refuse `max_tokens` in favour of
    `max_completion_tokens`, and any `temperature` but the default; they say so with the
    offending `param` in the error. One refusal per model is enough: later calls ask right away.
    """

    def __init__(self) -> None:
        self._by_model: dict[str, set[str]] = {}

    def body(self, model: str, messages: list[Message], max_tokens: int) -> bytes:
        learned = self._by_model.get(model, set())
        payload: dict[str, Any] = {"model": model, "messages": messages, "stream": False}
        if "temperature" not in learned:
            payload["temperature"] = 0.2
        payload["max_completion_tokens" if "max_tokens" in learned else "max_tokens"] = max_tokens
        return orjson.dumps(payload)

    def learn(self, model: str, status: int, answer: Any) -> bool:
        """True when a 400 refused a parameter we can adapt (so the call is worth retrying)."""
        if (
            status != 400
            or not isinstance(answer, dict)
            or not isinstance(answer.get("error"), dict)
        ):
            return False
        error = answer["error"]
        refused = ""
        if error.get("code") in ("unsupported_parameter", "unsupported_value"):
            refused = str(error.get("param") or "")
        if not refused:
            said = _REFUSAL.search(str(error.get("message") or ""))
            refused = said.group(1) if said else ""
        if refused not in _ADAPTABLE:
            return False
        # Also true when a concurrent call learned it first: this call retries adapted too.
        self._by_model.setdefault(model, set()).add(refused)
        return True


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
        parameters: ModelParameters,
    ) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._timeout_s = timeout_s
        self._parameters = parameters
        # The caller's own credentials (Authorization, or Azure-style keys) and organisation.
        self._headers = {"Content-Type": "application/json", **client_headers}
        if credential:
            self._headers["Authorization"] = credential

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        headers = {**self._headers, "X-Compaction-Purpose": purpose}
        for _ in range(3):  # at most two parameters to learn
            body = self._parameters.body(self._model, messages, max_tokens)
            status, answer = await post_json(
                self._client, self._url, body, headers, self._timeout_s
            )
            if not self._parameters.learn(self._model, status, answer):
                break
        if status != 200:
            raise SummarizerError(f"summarizer answered HTTP {status}")
        return _message_text(answer)


def _message_text(payload: Any) -> str:
    try:
        message = payload["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise SummarizerError("summarizer answer has no choices[0].message") from exc
    return message_text(message)
