"""A request as the compacting hook sees it: parsed once by its dialect, with its budget
(`RequestBuilder`: session, seed, credentials, window and calibration, from the whole body or,
for a recognized continuation, from its fields without the list).

Parsing is the expensive part of the decision, so `may_need_parsing` first bounds the prompt from
the byte length alone (the estimate never exceeds one token per byte; images and audio are the
exception and are looked for), and only bodies that could reach the lowest ratio are parsed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from compaction import HeuristicEstimator, JsonArray, Message, conversation_seed
from proxy.compacting.decision.identity import named_session
from proxy.compacting.models.calibration import Calibration
from proxy.compacting.models.discovery import WindowDiscovery
from proxy.compacting.models.llm_client import LLMRequest, Prefix
from proxy.compacting.models.overflow import LearnedWindows
from proxy.dialects import Dialect, is_injected
from proxy.interception import RequestContext
from proxy.settings import ModelsSettings

SCOPE_HEADERS = ("api-key", "x-api-key", "OpenAI-Organization", "OpenAI-Project")
"""Headers that identify the caller to the upstream besides Authorization (Azure-style keys,
OpenAI organisation and project): they go with the proxy's own summary calls and scope reuse."""

ACCOUNT_HEADERS = ("chatgpt-account-id", "originator")
"""Client headers the proxy's own calls carry so the upstream accepts and bills them where it
does the client's (a ChatGPT-plan Codex: the workspace account, and the client's name). Not
`x-codex-*`: its turn metadata would mark a summary call as the client's own compaction
request, and its beta features opt the client into behaviour no summary call uses. The list
is in docs/operations.md."""

# What can make a small body cost more than its bytes, found in one compiled scan of the body
# (on a small body the scan is most of the decision's time): a part with a fixed token cost
# (image, audio, file; group 1) and the output reservation (group 2).
_DECIDING_KEYS = re.compile(
    rb'"(?:(image_url|input_audio|file|input_image|input_file|image|document)"'
    rb'|max(?:_completion|_output)?_tokens"\s*:\s*(\d{1,9}))'
)


def may_need_parsing(
    body: bytes, *, smallest_window: int, lowest_tokens: float, factor: float
) -> bool:
    """False only when no estimate of `body` can reach `lowest_tokens` (where anything starts in
    the smallest window) nor, with its output reservation, overflow that window: its bytes bound
    its text's tokens, and only a fixed-cost part or an output reservation can add to them (any
    reservation: of a key given twice, the parser keeps the last)."""
    bound = len(body) * max(1.0, factor)
    if bound >= lowest_tokens:
        return True
    for found in _DECIDING_KEYS.finditer(body):
        if found.group(1) is not None or bound + int(found.group(2)) > smallest_window:
            return True
    return False


Payload = dict[str, Any]
"""A request's JSON object as parsed: every member the client sent, unknown ones included."""


@dataclass(frozen=True)
class ParsedRequest:
    dialect: Dialect
    body: bytes
    """The bytes as received: what a serializer splices into."""
    payload: Payload
    messages: list[Message]
    """The dialect's list: chat `messages`, Responses `input`, Anthropic `messages`."""
    extras: object
    """What the request costs besides `messages` (tools, instructions, system)."""
    model: str
    window: int
    max_output_tokens: int | None
    session_id: str
    opening: str
    """Fingerprint of the conversation's opening (head, tool names, first user message)."""
    credential: str | None
    """The Authorization the client sent (not an injected `upstream.api_key`)."""
    auth_headers: dict[str, str]
    """The caller's credentials besides Authorization, and the headers the dialect's summary
    call needs (anthropic-version); never logged."""
    query: str
    """The raw query string the request goes upstream with (Azure OpenAI's `api-version`)."""
    tenant: bytes
    """Digest of the caller's credentials: scopes the summarizer's cooldown."""
    seed: bytes
    """Digest of tenant and session: scopes checkpoints, so conversations never share them."""
    factor: float
    estimator: HeuristicEstimator
    array: JsonArray | None = None
    """Its `messages` as the JSON array in `body`, once that is located (a remembered body)."""
    window_source: str = "configured"
    """Where `window` came from: configured, default, discovered
    (proxy.compacting.models.discovery)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The client's request headers as received (what a client says of a request besides its
    body, such as Codex's turn metadata); never logged."""

    @property
    def conversation(self) -> str:
        """What scopes the archive within a session: the fingerprint of the conversation's
        opening, which digests the caller's credentials too (`opening`: read once per request,
        also where the fast path parses no message). A session id reused by a new conversation
        (one `/s/my-agent/` for every run of an agent) names another archive: each archives its
        own turns (an index is kept once per scope) and recalls only those."""
        return self.opening

    def with_budget(self, *, window: int, factor: float) -> ParsedRequest:
        estimator = HeuristicEstimator(factor, shape=self.dialect.shape)
        return replace(self, window=window, factor=factor, estimator=estimator)

    def located(self, array: JsonArray, count: int) -> ParsedRequest:
        """This request knowing where its messages array is in its body: `array`, of `count`
        items (unchanged if that is not how many messages it has)."""
        return replace(self, array=array) if count == len(self.messages) else self

    def messages_json(self, messages: list[Message]) -> JsonArray | None:
        """`messages` as a JSON array in the client's own bytes, when they are this request's
        whole list and it is located (None otherwise): a compaction's history then crosses to a
        worker process as the body it came in, not serialized again on the event loop (60-70
        ms at 50 MiB)."""
        return self.array if messages is self.messages else None

    def summarizer(self, model: str, prefix: Prefix | None = None) -> LLMRequest:
        """What this request's summarizer is built from: `model`, the caller's credentials, the
        dialect to ask in, the query string its upstream needs, and the conversation's request
        a cached summary request repeats (`prefix`; None: standalone)."""
        return LLMRequest(
            model, self.credential, self.auth_headers, self.dialect, self.query, prefix
        )

    def serialize(self, messages: list[Message]) -> bytes:
        """The request with its list replaced; every other field as sent, in its place."""
        return self.dialect.serialize(self.body, self.payload, messages)


@dataclass(frozen=True)
class Decision:
    """What to forward for one request, and what the response headers say about it."""

    messages: list[Message]
    status: str
    tokens_before: int
    tokens_after: int
    compaction_id: str | None
    stepped_aside: str | None = None
    """Why the request went as sent whatever its size (status `skipped`): a compaction its
    client or provider runs itself (Dialect.own_compaction)."""


def model_of(payload: Payload) -> str:
    model = payload.get("model")
    return model if isinstance(model, str) else ""


def fingerprint(opening: Mapping[str, Any], tenant: bytes = b"") -> str:
    """A stable session id for a request that names none: a digest of the conversation's
    opening (see Dialect.opening: head, tool names, first user message) and of the caller's
    credentials (`tenant`, a digest already).

    The first user message is part of it because the system prompt alone is the same for every
    conversation of one agent; the credentials, because two tenants whose conversations open
    the same way must never share a session, its records or its memory file."""
    named = {**opening, "tenant": tenant.hex()}
    try:
        canonical = orjson.dumps(named, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits from a lenient parser
        canonical = repr(named).encode()
    return f"fp-{hashlib.sha256(canonical).hexdigest()[:32]}"


def opening_of(messages: list[Message]) -> list[Message]:
    """The messages a fingerprint reads (Dialect.opening): up to and including the first user
    message with words of the person's (a Responses message item; any longer prefix would do
    too), past the turns a client injects its context in."""
    for i, message in enumerate(messages):
        if (
            isinstance(message, dict)
            and message.get("role") == "user"
            and message.get("type", "message") == "message"
            and not is_injected(message.get("content"))
        ):
            return messages[: i + 1]
    return messages


BodyParser = Callable[[Dialect, bytes], Awaitable[tuple[Payload, list[Message]]]]
"""How a body becomes its payload and its list (NotCompactable when the dialect does not
compact it)."""


async def parse_whole(dialect: Dialect, body: bytes) -> tuple[Payload, list[Message]]:
    """The plain parser: the dialect's, in one call."""
    return dialect.parse(body)


class RequestBuilder:
    """ParsedRequests from a request's context and payload, under the budget known now (the
    model's window, learned limits, calibration)."""

    def __init__(
        self,
        models: ModelsSettings,
        calibration: Calibration,
        learned: LearnedWindows,
        parse: BodyParser = parse_whole,
        discovery: WindowDiscovery | None = None,
    ) -> None:
        """`parse` reads a body (the hook gives proxy.compacting.fast's, which parses a large
        body in pieces, the event loop serving other requests in between, where parsing it
        whole would hold them all: about 170 ms at 50 MiB)."""
        self._models = models
        self._calibration = calibration
        self._learned = learned
        self._parse = parse
        self._discovery = discovery

    async def parse(self, ctx: RequestContext, dialect: Dialect, body: bytes) -> ParsedRequest:
        """The whole request (NotCompactable when the dialect does not compact it)."""
        payload, messages = await self._parse(dialect, body)
        await self._discover(ctx, dialect, payload)
        return self.build(ctx, dialect, body, payload, messages, messages, None)

    def _window_of(self, model: str) -> tuple[int, str]:
        configured = self._models.configured_window(model)
        if configured is not None:
            return configured, "configured"
        found = self._discovery.known(model) if self._discovery is not None else None
        if found is not None:
            return found.tokens, found.source
        return self._models.default_context_window, "default"

    async def _discover(
        self, ctx: RequestContext, dialect: Dialect, payload: dict[str, Any]
    ) -> None:
        """Look up the window of a model the configuration does not name, once per model (the
        OpenAI-shaped upstream publishes it; Anthropic's models are not listed there)."""
        model = model_of(payload)
        if self._discovery is None or not dialect.lists_models or not model:
            return
        if self._models.configured_window(model) is None:
            names = ("Authorization", *SCOPE_HEADERS)
            await self._discovery.discover(
                model, {name: ctx.headers[name] for name in names if name in ctx.headers}
            )

    def build(
        self,
        ctx: RequestContext,
        dialect: Dialect,
        body: bytes,
        payload: Payload,
        messages: list[Message],
        opening_messages: list[Message],
        opening: str | None,
    ) -> ParsedRequest:
        """The request from its payload; `opening_messages` holds at least its messages up to
        the first user message (all a fingerprint reads); `opening`, their fingerprint if known."""
        model = model_of(payload)
        auth = {name: ctx.headers[name] for name in SCOPE_HEADERS if name in ctx.headers}
        tenant = conversation_seed(ctx.credential or "", *auth.values())
        # Headers the summary call needs but that do not name the caller (anthropic-version,
        # the account a ChatGPT sign-in bills).
        for name in (*dialect.call_headers, *ACCOUNT_HEADERS):
            if name in ctx.headers:
                auth[name] = ctx.headers[name]
        if opening is None:  # hashing the opening costs as much as the first user message is long
            opening = fingerprint(dialect.opening(payload, opening_messages), tenant)
        session_id = (
            ctx.explicit_session or named_session(dialect.session_name(payload), tenant) or opening
        )
        window, source = self._window_of(model)
        budget = self._learned.window(model, window)  # an upstream's refusal may lower it
        factor = self._calibration.factor(model)
        return ParsedRequest(
            dialect=dialect,
            body=body,
            payload=payload,
            messages=messages,
            extras=dialect.extras(payload),
            model=model,
            window=budget,
            window_source=source if budget == window else "learned",
            max_output_tokens=dialect.max_output(payload),
            session_id=session_id,
            opening=opening,
            # The client's own: the summarizer adds the key of the upstream it calls.
            credential=ctx.headers.get("Authorization"),
            auth_headers=auth,
            headers=ctx.headers,
            query=ctx.query,
            tenant=tenant,
            seed=conversation_seed(tenant.hex(), session_id),
            factor=factor,
            estimator=HeuristicEstimator(factor, shape=dialect.shape),
        )
