"""What every dialect is: the `Dialect` protocol the rest of the proxy talks to, and the payload
types it speaks in (`JsonObject`, `NotCompactable`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from compaction import Message, Shape

JsonObject = dict[str, object]
"""A JSON object whose fields are unknown until read: each is narrowed where it is used."""


class NotCompactable(ValueError):
    """The body is not a request this dialect compacts: forward it untouched."""


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
