"""The library's ChatLLM implemented over the configured upstream, in the request's dialect.

Summary and memory-extraction calls go to the dialect's endpoint (`chat/completions`,
`responses`, or Anthropic's `messages`), non-streaming, with the caller's own credentials and an
`PURPOSE` header (proxy.outcome) so operators can tell their cost apart. They never reach the
client. A standalone call carries no tools and asks at a low temperature (where the model allows
one). A cached call (`compaction.summary_request: cached`, a `PrefixLLM`) repeats the
conversation's request as forwarded (model, system, tools, every field but the streaming and
the answer's length) and adds its question as a final user turn, so the provider's prompt cache
covers the conversation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from compaction import ChatLLM, Message, Purpose
from proxy.dialects import Dialect
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.http.upstream import Upstream
from proxy.outcome import PURPOSE
from proxy.recall.tools import equip

_ADAPTABLE = ("max_tokens", "temperature", "reasoning.effort")
_REFUSAL = re.compile(r"Unsupported (?:parameter|value): '([\w.]+)'")


class SummarizerError(Exception):
    """The summarizer's answer could not be used (status, shape)."""


class ModelParameters:
    """What each summary model accepts, learned from the upstream's own 400 answers.

    Reasoning models (OpenAI's o-series and later) refuse `max_tokens` in favour of
    `max_completion_tokens`, and any `temperature` but the default; other models refuse
    `reasoning.effort`. They say so with the offending `param` in the error. One refusal per
    model is enough: later calls ask right away. At most `max_models` models are remembered,
    the least recently learned forgotten first (a model forgotten is refused once more).
    """

    def __init__(self, max_models: int = 1024) -> None:
        self._by_model: LRUCache[str, set[str]] = LRUCache(max_models)

    def refused(self, model: str) -> set[str]:
        """The parameters `model` refused so far (the dialect leaves them out)."""
        return self._by_model.get(model, set())

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


@dataclass(frozen=True)
class Prefix:
    """A conversation's request as it is forwarded: a cached summary request repeats it."""

    payload: Mapping[str, object]
    """The request's fields as the client sent them."""
    messages: list[Message]
    """Its list as forwarded (the view the compaction folds), before the dialect's wire form."""
    room: int
    """The tokens its window leaves after it (PrefixLLM.room_after_prefix)."""
    recall: bool = False
    """It went upstream with the `recall` tool and its summary's recall line (proxy.recall): a
    compacted view; the summary request carries both too, or its prompt would part from the
    forwarded one at the tools, before the conversation, and nothing of it be read from the
    cache."""


@dataclass(frozen=True)
class LLMRequest:
    """What a summarizer for one request is built from: the model to ask and the caller's own
    credentials (`credential`: the Authorization the client sent, not one the proxy injected;
    Azure-style keys, organisation); never logged."""

    model: str
    credential: str | None
    auth_headers: Mapping[str, str]
    dialect: Dialect = CHAT_COMPLETIONS
    """The API shape of the request: its summaries are asked in the same shape."""
    query: str = ""
    """The request's raw query string: the upstream may need it (Azure OpenAI's api-version)."""
    prefix: Prefix | None = None
    """The conversation's request, for a cached summary request (None: standalone only)."""


# The summarizer factory the compacting hook is given (`llm_for`): tests and other transports
# pass their own; the default is UpstreamLLMFactory.
LLMFactory = Callable[[LLMRequest], ChatLLM]


class UpstreamLLMFactory:
    """`llm_for`: summarizers over the app's upstream, sharing what they learn of each model."""

    def __init__(self, upstream: Upstream, *, timeout_s: float, max_models: int = 1024) -> None:
        self._upstream = upstream
        self._timeout_s = timeout_s
        self._parameters = ModelParameters(max_models)

    def __call__(self, request: LLMRequest) -> ChatLLM:
        if request.prefix is not None:
            return CachedUpstreamLLM(
                self._upstream,
                request,
                request.prefix,
                timeout_s=self._timeout_s,
                parameters=self._parameters,
            )
        return UpstreamLLM(
            self._upstream, request, timeout_s=self._timeout_s, parameters=self._parameters
        )


class UpstreamLLM:
    def __init__(
        self,
        upstream: Upstream,
        request: LLMRequest,
        *,
        timeout_s: float,
        parameters: ModelParameters,
    ) -> None:
        self._upstream = upstream
        self._dialect = request.dialect
        self._url = upstream.url_for(request.dialect.summary_path, request.query)
        self._model = request.model
        self._timeout_s = timeout_s
        self._parameters = parameters
        self._headers = {"Content-Type": "application/json", **request.auth_headers}
        # The client's own Authorization, else the configured key of the upstream this call
        # goes to (none for Anthropic): never the key injected for the agent's request, which
        # may have gone to another upstream.
        api_key = upstream.api_key_for(request.dialect.summary_path, request.auth_headers)
        credential = request.credential or (f"Bearer {api_key}" if api_key else None)
        if credential:
            self._headers["Authorization"] = credential

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        return await self._ask(
            lambda refused: self._dialect.summary_body(self._model, messages, max_tokens, refused),
            purpose,
        )

    async def _ask(self, body_for: Callable[[set[str]], bytes], purpose: Purpose) -> str:
        """The text of the answer to the body `body_for` builds without the parameters the
        model refused (learned, and asked again, as often as a new one is refused)."""
        headers = {**self._headers, PURPOSE: purpose}
        for _ in range(len(_ADAPTABLE) + 1):  # each parameter learned once
            body = body_for(self._parameters.refused(self._model))
            status, answer = await self._upstream.post_json(
                self._url, body, headers, self._timeout_s
            )
            if not self._parameters.learn(self._model, status, answer):
                break
        if status != 200:
            raise SummarizerError(f"summarizer answered HTTP {status}")
        text = self._dialect.summary_text(answer)
        if text is None:
            raise SummarizerError(f"the {self._dialect.name} summarizer answer holds no text")
        return text

    async def compact_natively(
        self, payload: Mapping[str, object], folded: list[Message], max_tokens: int
    ) -> dict[str, Any]:
        """The provider's own compaction block over `folded` (wire form), asked with the
        conversation's `payload` fields (proxy.dialects.base.NativeCompaction)."""
        native = self._dialect.native
        if native is None:
            raise SummarizerError(f"the {self._dialect.name} API has no compaction of its own")
        headers = {**self._headers, PURPOSE: "summary", **native.request_headers(self._headers)}
        body = native.request_body(payload, folded, max_tokens)
        status, answer = await self._upstream.post_json(self._url, body, headers, self._timeout_s)
        if status != 200:
            raise SummarizerError(f"native compaction answered HTTP {status}")
        block = native.block_of(answer)
        if block is None:
            raise SummarizerError("the native compaction answer holds no compaction block")
        return block


class NativeCompactor:
    """`compaction.summarizer: native`: compaction blocks asked of the app's upstream."""

    def __init__(self, upstream: Upstream, *, timeout_s: float) -> None:
        self._upstream = upstream
        self._timeout_s = timeout_s
        self._parameters = ModelParameters(1)

    async def block(
        self,
        request: LLMRequest,
        payload: Mapping[str, object],
        folded: list[Message],
        max_tokens: int,
    ) -> dict[str, Any]:
        llm = UpstreamLLM(
            self._upstream, request, timeout_s=self._timeout_s, parameters=self._parameters
        )
        return await llm.compact_natively(payload, folded, max_tokens)


class CachedUpstreamLLM(UpstreamLLM):
    """An UpstreamLLM that can also ask after the conversation's own request (a PrefixLLM)."""

    def __init__(
        self,
        upstream: Upstream,
        request: LLMRequest,
        prefix: Prefix,
        *,
        timeout_s: float,
        parameters: ModelParameters,
    ) -> None:
        super().__init__(upstream, request, timeout_s=timeout_s, parameters=parameters)
        self._prefix = prefix

    @property
    def room_after_prefix(self) -> int:
        # The reasoning the summary request lets the model spend comes out of the answer's room.
        return self._prefix.room - self._dialect.reasoning_room(self._prefix.payload)

    async def complete_after_prefix(
        self, instruction: str, *, purpose: Purpose, max_tokens: int
    ) -> str:
        prefix, dialect = self._prefix, self._dialect
        listed = dialect.wire(prefix.messages)

        def body_for(refused: set[str]) -> bytes:
            body = dialect.cached_summary_body(
                prefix.payload, listed, instruction, max_tokens, refused
            )
            serialized = orjson.dumps(body)
            if prefix.recall:
                # Placed as in the forwarded request: the tool after the client's tools, the
                # line in the summary (the body's keys are in the order serialized).
                serialized = equip(serialized, body, dialect) or serialized
            return serialized

        return await self._ask(body_for, purpose)
