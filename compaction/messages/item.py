"""The neutral view of one raw message (`Item`), and the `Shape` protocol that produces it.

Segmenting, pairing checks, transcripts, ledgers and extraction work from Items only; each API's
message shape lives in its own sibling module (chat, responses, anthropic) and is the one place
that looks inside its raw messages. Raw messages are never edited: an Item is derived, computed
once per message, and the library keeps the raw list and a parallel list of Items side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import orjson

from compaction.marker import is_summary_text
from compaction.messages.injected import strip_injected
from compaction.types import Message

Kind = Literal["head", "user", "assistant", "tool", "summary", "other"]
"""head: system/developer instructions; user: a user turn (a tool observation included, see
`Item.observation`); assistant: the model's turn; tool: a tool's result; summary: a summary this
library inserted; other: anything else, malformed items included."""

OBSERVATION_PREFIXES = ("<returncode>", "Please always provide EXACTLY ONE action")
"""mini-swe-agent's shell output and its malformed-action reminder: user-role, not requests."""

# Token costs the APIs add. Images: OpenAI's published costs (`detail: low` is flat,
# high/auto typically a 2x2-tile image); audio and files: rough flat costs for media we do not
# decode; a message's role and separators; a call's id, type and JSON framing.
IMAGE_LOW_TOKENS = 85
IMAGE_HIGH_TOKENS = 765
AUDIO_PART_TOKENS = 200
FILE_PART_TOKENS = 500
MESSAGE_OVERHEAD_TOKENS = 4
TOOL_CALL_OVERHEAD_TOKENS = 8
ENCRYPTED_CHARS_PER_TOKEN = 16
ENCRYPTED_MAX_TOKENS = 32_768
"""Sealed reasoning (Responses `encrypted_content`, Anthropic `redacted_thinking.data`) is
counted by a bounded factor, not as text and not by its decoded size: one token per 16 base64
characters (12 sealed bytes), at most 32,768 tokens a payload. Why: the upstream charges the
reasoning it sealed, not the ciphertext, and drops the reasoning of turns before the latest user
message altogether (OpenAI and Anthropic both document this); ciphertext is never shorter than
its plaintext (4 bytes a token as text), so a quarter of the text rate still errs high, and no
payload carries more reasoning than one turn's output budget. Counting it as text made a 3 MB
payload 563k tokens."""
BASE64_CHARS_PER_TOKEN = 8
"""Inline file data (a base64 PDF) at one token per 8 characters (6 bytes): a rough middle
between a text PDF (a few bytes a token) and a scanned one (many more); erring high is safer."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model makes. `id` is None when the raw call has none; `name` is None when it
    is not a well-formed function call (such a call still counts for pairing by its id)."""

    id: str | None
    name: str | None
    arguments: str
    """The raw JSON text the model produced (may be invalid JSON)."""

    def parsed(self) -> dict[str, Any]:
        """The arguments as a dict; {} when they are not a JSON object."""
        try:
            value = orjson.loads(self.arguments)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


class Item(NamedTuple):
    """The neutral view of one raw message.

    A NamedTuple, not a frozen dataclass: one is built for every message of every plan, and a
    tuple is built at a third of the cost (a frozen dataclass sets each field through
    `object.__setattr__`)."""

    kind: Kind
    text: str = ""
    """Its prose text, for transcripts and ledgers (a malformed item: its repr)."""
    calls: tuple[ToolCall, ...] = ()
    answers: tuple[str, ...] = ()
    """The call ids this item answers (a tool result without an id answers none)."""
    observation: bool = False
    """A user-role message that is really tool output."""
    lead: bool = False
    """Must stay glued to the item after it (a Responses `reasoning` item, or the model's message
    before its calls); never for chat."""
    joins: bool = False
    """A call item that joins the call items just before it when their results have not started
    yet (Responses sends one item per call); never for chat, where a new assistant message with
    calls leaves the earlier calls unanswered."""
    label: str = ""
    """What a transcript calls it: the role or item type; "" for a malformed item."""
    injected: bool = False
    """A user turn holding only what the client injected (Codex's `<environment_context>`,
    Claude Code's `<system-reminder>`…, see injected.py): context, no request of the person's."""
    sealed: bool = False
    """A provider's compaction (a Responses `compaction` item, an Anthropic turn holding a signed
    `compaction` block): what the provider already compacted, readable only by it. It and
    everything before it are the head (segment.head_end): never folded, moved or re-encoded."""

    @property
    def call_ids(self) -> tuple[str, ...]:
        """The ids of its calls: what the following results must answer."""
        return tuple(call.id for call in self.calls if call.id is not None)

    @property
    def functions(self) -> tuple[ToolCall, ...]:
        """Its well-formed function calls (those with a name)."""
        return tuple(call for call in self.calls if call.name is not None)

    @property
    def is_request(self) -> bool:
        """Something the user wrote: not a summary, not a tool observation, not only the
        context a client injected."""
        return self.kind == "user" and not self.observation and not self.injected

    @property
    def is_prose(self) -> bool:
        """What the user or the assistant wrote (no tool output)."""
        return self.is_request or self.kind == "assistant"

    @property
    def is_malformed(self) -> bool:
        return self.kind == "other" and not self.label


class Shape(Protocol):
    """What the library needs to know about one API's message shape."""

    def read(self, raw: object) -> Item:
        """The neutral view of `raw`; never raises, whatever `raw` is."""
        ...

    def summary_message(self, text: str) -> Message:
        """The raw message that carries a summary whose full text (marker included) is `text`."""
        ...

    def is_summary(self, raw: object) -> bool:
        """True for a message this library inserted as a summary (see marker.py)."""
        ...

    def measure(self, raw: object, text_cost: Callable[[str], float]) -> float:
        """Tokens of `raw`: `text_cost` for each string, flat costs for media and framing."""
        ...

    def with_output(self, raw: object, reduce: Callable[[str], str]) -> Message | None:
        """A new message like `raw` (ids, flags and unknown fields kept) whose tool output is
        `reduce(output text)`, each output of it when it holds several; None when `raw` carries
        no tool output (`raw` itself is never edited)."""
        ...


_new = tuple.__new__


def user_item(text: str, label: str, *, observation: bool = False) -> Item:
    """A user turn's Item: a tool observation as it is; else the person's words without the
    elements a client injected into them (a turn of injected context only keeps its text, as
    context, and is no request)."""
    # Built as a tuple of all fields (less Item's keyword handling): one per user turn.
    if observation:
        return _new(Item, ("user", text, (), (), True, False, False, label, False, False))
    said = strip_injected(text)
    if said == text:  # most turns: `said` is `text` itself
        return _new(Item, ("user", text, (), (), False, False, False, label, False, False))
    said = said.strip()
    if not said:
        return Item("user", text, label=label, injected=True)
    return Item("user", said, label=label)


def user_summary(text: str) -> Message:
    """A summary carried as a plain user message (chat and Anthropic)."""
    return {"role": "user", "content": text}


def is_user_summary(raw: object) -> bool:
    """True for a user message whose string content is a summary (see marker.py)."""
    if not isinstance(raw, dict) or raw.get("role") != "user":
        return False
    content = raw.get("content")
    return isinstance(content, str) and is_summary_text(content)


def json_text(item: object) -> str:
    """Any item as the JSON text the upstream would see; never raises."""
    try:
        return orjson.dumps(item, default=str).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(item)


def is_observation_text(text: str) -> bool:
    """True for a user message's text that is really tool output (see OBSERVATION_PREFIXES)."""
    return text.lstrip().startswith(OBSERVATION_PREFIXES)


def file_data_tokens(data: object) -> float:
    """What inline base64 file data costs by its length; FILE_PART_TOKENS for a file sent by
    reference (an id, a URL), whose size we cannot see."""
    if not isinstance(data, str):
        return FILE_PART_TOKENS
    return max(FILE_PART_TOKENS, len(data) / BASE64_CHARS_PER_TOKEN)


def encrypted_tokens(data: object) -> float:
    """What one sealed reasoning payload costs (see ENCRYPTED_CHARS_PER_TOKEN); anything that is
    not a string costs nothing."""
    if not isinstance(data, str):
        return 0.0
    return min(float(ENCRYPTED_MAX_TOKENS), len(data) / ENCRYPTED_CHARS_PER_TOKEN)


SEALED_ENVELOPE_BYTES = 650
"""What a sealed compaction's ciphertext carries besides the summary (version, key id, nonce,
tag): Codex's own figure (codex-rs `context_manager/history.rs`, estimate_reasoning_length)."""


def sealed_summary_tokens(data: object) -> float:
    """What a provider's sealed compaction costs (a Responses `compaction` item's
    `encrypted_content`): the summary it seals, which the upstream expands and charges in full
    on every request. Estimated as Codex estimates it: the base64 decoded (3 bytes for 4
    characters) less the envelope, at 4 bytes a token (the text rate). Unlike sealed reasoning
    (encrypted_tokens) it is not capped: the upstream never drops it."""
    if not isinstance(data, str):
        return 0.0
    return max(0.0, len(data) * 3 / 4 - SEALED_ENVELOPE_BYTES) / 4


def measure_value(value: object, text_cost: Callable[[str], float]) -> float:
    """A string's cost, None's nothing, anything else its JSON text's cost."""
    if value is None:
        return 0.0
    if isinstance(value, str):
        return text_cost(value)
    return text_cost(json_text(value))


def read_all(messages: Iterable[object], shape: Shape) -> list[Item]:
    """The neutral view of each message, in order (a list parallel to `messages`)."""
    return [shape.read(message) for message in messages]
