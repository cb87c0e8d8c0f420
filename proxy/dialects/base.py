"""What every dialect is: the `Dialect` protocol the rest of the proxy talks to, and the types it
speaks in: a payload (`JsonObject`, `NotCompactable`), a response's calls to a tool the proxy
answers itself (`Call`, `Calls`), and the readers of a whole (`Turns`) or a streamed
(`StreamedTurn`) response that calls it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from compaction import Message, Shape

JsonObject = dict[str, object]
"""A JSON object whose fields are unknown until read: each is narrowed where it is used."""


class NotCompactable(ValueError):
    """The body is not a request this dialect compacts: forward it untouched."""


@dataclass(frozen=True)
class Call:
    """One call of the model's to the tool the proxy answers (proxy.recall's `recall`)."""

    id: str
    arguments: object
    """A JSON text (chat, responses) or an object (anthropic)."""


@dataclass(frozen=True)
class Calls:
    recall: list[Call]
    others: int
    """Calls to the client's own tools."""


class Turns(Protocol):
    """A whole (non-streamed) response's calls to one tool of the proxy's: finding them, taking
    them out, and continuing the request with the call and its result (the history a strict
    upstream accepts: every call answered, ids matching)."""

    def calls(self, response: JsonObject) -> Calls: ...

    def without_calls(self, response: JsonObject) -> JsonObject:
        """`response` as the client would have had it without the calls to the tool."""
        ...

    def continue_with(
        self, payload: JsonObject, response: JsonObject, answered: list[tuple[Call, str]]
    ) -> None:
        """Append `response`'s turn and the answers to its calls to `payload`'s list."""
        ...

    def after_rounds(self, first: JsonObject, final: JsonObject) -> JsonObject:
        """`final`, the response the client gets after hidden rounds that began with `first`,
        leaving the client a history the API accepts on its next request (Anthropic: no
        thinking written after a call and result the client never sees)."""
        ...


class StreamedTurn(Protocol):
    """One streamed response after another (a round's continues the first), read event by
    event: `read` gives the bytes the client gets now, None to withhold (the tool's calls, and
    the finish of a response that only called it). When the upstream's stream ends, `recall`
    and `others` say what it called. If a round follows, `continue_with` appends the turn and
    the answers to the request and `begin` readies the reader for the next response; if not,
    `ending` is what the client still needs to see its stream end well (the withheld finish,
    usage summed over the rounds, the end marker)."""

    @property
    def recall(self) -> list[Call]: ...

    @property
    def others(self) -> int: ...

    @property
    def usage(self) -> object:
        """The first response's usage (calibration), None until seen."""
        ...

    @property
    def spent(self) -> object:
        """The usage of the response being read (a round's cost), None until seen."""
        ...

    def read(self, event: bytes) -> bytes | None: ...

    def begin(self) -> None: ...

    def continue_with(self, payload: JsonObject, answered: list[tuple[Call, str]]) -> None: ...

    def ending(self) -> bytes: ...


class NativeCompaction(Protocol):
    """A provider's own compaction the proxy asks for as its summarizer (`compaction.summarizer:
    native`; proxy.dialects.anthropic.native): its request, its answer's block, and where the
    block goes in a compacted list."""

    def request_body(
        self, payload: Mapping[str, object], folded: list[Message], max_tokens: int
    ) -> bytes: ...

    def request_headers(self, incoming: Mapping[str, str]) -> dict[str, str]:
        """Headers the compaction request adds to the client's (its beta)."""
        ...

    def beta_for(self, body: bytes, incoming: Mapping[str, str]) -> dict[str, str]:
        """Headers a forwarded `body` adds to the client's: the beta while it carries a block."""
        ...

    def block_of(self, answer: object) -> dict[str, Any] | None: ...

    def carrying(self, summary: Message, block: dict[str, Any]) -> Message:
        """The checkpoint's summary message standing for `block` on the wire."""
        ...

    def has_native(self, messages: Sequence[Message]) -> bool:
        """True when `messages` lead with a summary standing for a block (it is always first)."""
        ...


class Dialect(Protocol):
    @property
    def name(self) -> str:
        """ "chat", "responses" or "anthropic": the `dialect` of records and metrics."""
        ...

    @property
    def shape(self) -> Shape: ...

    @property
    def summary_path(self) -> str:
        """Where this API's summaries are asked, under /v1/."""
        ...

    @property
    def call_headers(self) -> tuple[str, ...]:
        """Client headers a summary call of this API needs besides the credentials."""
        ...

    @property
    def items_key(self) -> str:
        """The top-level field holding the list: `messages`, or Responses' `input`."""
        ...

    @property
    def joins_summary(self) -> bool:
        """True when `wire` joins the summary with the user turns right after it (Anthropic)."""
        ...

    @property
    def native(self) -> NativeCompaction | None:
        """The provider's own compaction as a summarizer (None: the API has none)."""
        ...

    @property
    def has_thinking(self) -> bool:
        """True when the API's turns carry thinking blocks that may be bound to their prefix
        (Anthropic; proxy.compacting.decision.thinking)."""
        ...

    def refuses_bound_thinking(self, status: int, body: bytes) -> bool:
        """True for the upstream's error saying a thinking block's prefix changed."""
        ...

    def without_thinking(self, message: Message) -> Message | None:
        """A copy of `message` without its thinking blocks; None when it has none."""
        ...

    def parse(self, body: bytes) -> tuple[JsonObject, list[Message]]:
        """The payload and its list of messages; NotCompactable when it has none to compact."""
        ...

    def items(self, payload: Mapping[str, object]) -> list[Message]:
        """The payload's list; NotCompactable when the payload is not one this dialect compacts
        (a recognized request's fields are checked with it, its list being empty)."""
        ...

    def wire(self, messages: list[Message]) -> list[Message]:
        """The list as it goes upstream (`serialize` sends this): kept items stay the same
        objects, new ones are new objects."""
        ...

    def extras(self, payload: Mapping[str, object]) -> object:
        """What the request costs besides its list (tools, instructions, system), as one value
        whose JSON text is measured."""
        ...

    def max_output(self, payload: Mapping[str, object]) -> int | None: ...

    def opening(self, payload: Mapping[str, object], messages: list[Message]) -> JsonObject:
        """What names a conversation that names no session: head, tool names, first user turn."""
        ...

    def serialize(
        self, body: bytes, payload: Mapping[str, object], messages: list[Message]
    ) -> bytes:
        """The request with its list replaced by `messages`; every other field as sent."""
        ...

    def prompt_tokens(self, usage: Mapping[str, object]) -> int | None:
        """The prompt's tokens as the upstream counted them in a response's `usage`."""
        ...

    def summary_body(
        self, model: str, messages: list[Message], max_tokens: int, refused: set[str]
    ) -> bytes:
        """A summary request from the library's chat-shaped `messages` (system + user), leaving
        out the parameters in `refused` that the model turned down before."""
        ...

    def reasoning_room(self, payload: Mapping[str, object]) -> int:
        """The tokens a cached summary request of `payload` adds to its answer's length for the
        reasoning the model spends first (the request's own reasoning settings kept, so its
        cache holds): counted in the room the window must leave after the prompt."""
        ...

    def cached_summary_body(
        self,
        payload: Mapping[str, object],
        listed: list[Message],
        instruction: str,
        max_tokens: int,
        refused: set[str],
    ) -> JsonObject:
        """A cached summary request: the request `payload` with its list `listed` (as
        forwarded, in wire form) and `instruction` as a final user turn; every field that
        makes up the prompt (model, system, tools, tool choice, cache markers) as sent, the
        streaming off and the answer's length `max_tokens`."""
        ...

    def summary_text(self, answer: object) -> str | None:
        """The summarizer's text in `answer`, None when the answer has none."""
        ...

    # -- what else of the wire the rest of the proxy asks --------------------------------------

    @property
    def lists_models(self) -> bool:
        """True when the OpenAI-shaped upstream's model listing names this API's models (where
        an unconfigured window is looked up)."""
        ...

    @property
    def usage_holder(self) -> str | None:
        """The field of a response document (or a stream's event) holding its `usage`, None
        when `usage` is at its top level."""
        ...

    def own_compaction(
        self, payload: Mapping[str, object], last: object, headers: Mapping[str, str]
    ) -> str | None:
        """Why the request is a compaction its provider or its client runs itself (its
        provider's rules, in its `rules` module, and proxy.dialects.clients): the reason it is
        forwarded as sent, nothing folded or added; None when it is not one. `payload` holds the
        request's fields (its list may be missing: a recognized request), `last` its list's
        last item, `headers` the client's."""
        ...

    def session_name(self, payload: Mapping[str, object]) -> str | None:
        """The name the client gives its conversation in the body (a session field of this
        API's or of a client known to speak it); None when it names none."""
        ...

    def spent_tokens(self, usage: object) -> tuple[int, int]:
        """(input, output) tokens of a response's `usage` (0 for what it does not say)."""
        ...

    def calls_outside_content(self, message: Mapping[str, object]) -> object:
        """The tool calls a message carries beside its `content` (chat's `tool_calls`), None
        when it has none there: a receipt shows them with the message's text."""
        ...

    def tool(self, name: str, description: str, parameters: Mapping[str, object]) -> JsonObject:
        """A function tool as this API declares it in a request's `tools`."""
        ...

    def turns(self, tool: str) -> Turns:
        """The reader of a whole response's calls to `tool`."""
        ...

    def stream(self, tool: str) -> StreamedTurn:
        """A fresh reader of a streamed response that may call `tool`."""
        ...

    def error_body(self, status: int, message: str, type_: str, code: str | None) -> bytes:
        """An error the proxy originates, in this API's error shape."""
        ...
