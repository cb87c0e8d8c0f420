"""The values and protocols shared across the compaction library.

Messages stay plain dicts exactly as the caller sent them (unknown fields included); everything
the library derives from them is a frozen dataclass (or, where one is built per message, a
NamedTuple: as immutable, and cheaper to build) that points back into the list by index.
Whatever needs I/O (the summarizing LLM, the token counter) is a Protocol passed in.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from compaction.text import normalize

Message = dict[str, Any]
"""One chat message as the caller sent it. Never copied, never edited in place."""

Tools = object
"""A request's tool definitions as the caller sent them (None when it has none): only what they
cost in tokens matters here, so any value is accepted."""

Purpose = Literal["summary", "memory"]
"""Why the library calls the LLM; the proxy turns it into `X-Compaction-Purpose`."""

MemoryType = Literal["decision", "fact", "preference", "todo"]
MEMORY_TYPES: frozenset[str] = frozenset({"decision", "fact", "preference", "todo"})


def as_memory_type(kind: str) -> MemoryType:
    """`kind` as a MemoryType; anything unknown is a fact."""
    if kind == "decision":
        return "decision"
    if kind == "preference":
        return "preference"
    if kind == "todo":
        return "todo"
    return "fact"


Quality = Literal["good", "acceptable", "poor"]
"""How much of the key information a summary kept: the verification's grade."""

ResultPath = Literal["llm", "extractive", "dropped", "selective", "unchanged"]
"""How a compaction produced its result: the LLM summary, the extractive fallback built by code,
dropping the oldest blocks, old tool outputs reduced to previews (compaction.selective, no
summary), or nothing changed (not needed, not possible, or a failed check)."""

Preview = tuple[int, Message]
"""Message `index` of a list, and the message that replaces it: its tool output cut to a preview
(compaction.selective)."""


class ChatLLM(Protocol):
    """The one thing the library needs from an LLM: a non-streaming chat completion's text.

    Implementations raise any exception on failure; the library treats every exception (and
    empty or nonsensical text) as a failed call and falls back.
    """

    async def complete(
        self, messages: list[Message], *, purpose: Purpose, max_tokens: int
    ) -> str: ...


@runtime_checkable
class PrefixLLM(ChatLLM, Protocol):
    """A ChatLLM that can also ask after the conversation's own request: the same model,
    system, tools and messages as last forwarded, then `instruction` as a final user turn, so
    the provider's prompt cache covers all but the question (compaction.summarize)."""

    @property
    def room_after_prefix(self) -> int:
        """The tokens the window leaves after the conversation's request: for the question and
        the answer."""
        ...

    async def complete_after_prefix(
        self, instruction: str, *, purpose: Purpose, max_tokens: int
    ) -> str: ...


class TokenEstimator(Protocol):
    """Counts tokens the way the upstream will. An exact tokenizer can be plugged in later."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: object) -> int:
        """One message including its per-message overhead; must accept malformed items."""
        ...

    def count_tools(self, tools: Tools) -> int:
        """The request's `tools` definitions (None or malformed counts as their JSON size)."""
        ...


class Block(NamedTuple):
    """Messages [start, end) that are kept or folded together.

    kind "tool": an item with calls and every item answering them (segment.block_end).
    kind "message": any other single message (malformed ones included, kept in place).
    """

    start: int
    end: int
    kind: Literal["tool", "message"]
    tokens: int
    user_led: bool = False
    """Opened by a user-role message (a request or an observation): never right after a summary
    when roles must alternate."""


class Round(NamedTuple):
    """A user item (at `start`) and everything after it up to the next user item.

    The preamble round (messages between the head and the first real user message, such as an
    earlier summary or an assistant greeting) has `has_user=False`.
    """

    start: int
    end: int
    blocks: tuple[Block, ...]
    has_user: bool
    tokens: int


@dataclass(frozen=True)
class Segments:
    """A message list cut into head (leading system/developer messages) and rounds."""

    head_end: int
    rounds: tuple[Round, ...]
    head_tokens: int
    tools_tokens: int
    total_tokens: int
    task: int | None = None
    """Where the conversation's task (its first request) is; None when it is not in the list as
    a message (an earlier summary quotes it) or there is none."""
    context: tuple[tuple[int, int], ...] = ()
    """The latest turn of each kind of context the client injected (Item.injected: Codex's
    `<environment_context>`, Claude Code's `<system-reminder>`...) after the head, in order, as
    (index, tokens): a fold that would take one pins it, so the model keeps the client's latest
    context. Such a turn may end a block (after a Responses assistant message, which leads what
    follows it): it is pinned alone, and the rest of its block folded."""

    def block_at(self, start: int) -> Block | None:
        """The block that starts at message `start`."""
        return self._blocks.get(start)

    def round_of(self, index: int) -> Round | None:
        """The round holding message `index` (found by bisection: rounds are in order)."""
        found = bisect_right(self._round_starts, index) - 1
        if found < 0:
            return None
        round_ = self.rounds[found]
        return round_ if index < round_.end else None

    @cached_property
    def _blocks(self) -> dict[int, Block]:
        return {b.start: b for r in self.rounds for b in r.blocks}

    @cached_property
    def _round_starts(self) -> list[int]:
        return [r.start for r in self.rounds]


@dataclass(frozen=True)
class Plan:
    """What to fold. The compacted list is

        messages[:head_end] + [summary] + [messages[i] for i in pinned] + messages[keep_from:]

    and every index in [head_end, keep_from) not in `pinned` is folded into the summary.
    `pinned` holds the user message of a round that is cut inside (a huge single round).
    """

    head_end: int
    keep_from: int
    pinned: tuple[int, ...]
    tokens_before: int
    target_tokens: int
    summary_budget_tokens: int
    fits: bool
    """False when even the kept part alone cannot reach the target (a single giant block)."""
    note: str = ""
    quoted: tuple[int, ...] = ()
    """Folded requests the summary must quote (clipped head and tail when large): the task when
    too big to pin, and, when roles must alternate, whatever would otherwise be pinned."""
    pinned_budget_tokens: int = 0
    """Room for the user's standing instructions in the summary, on top of
    `summary_budget_tokens`."""
    previews: tuple[Preview, ...] = ()
    """A selective plan (compaction.selective): these messages are replaced by their previews,
    in order, and nothing is folded (`keep_from == head_end`)."""
    summarize: bool = True
    """False: the summary is built by code, without a model call (`strategy: selective`, when
    the previews alone are not enough: plan.preview_slack)."""

    @cached_property
    def folded(self) -> tuple[int, ...]:
        """The indices between the head and the kept tail that are not pinned. Kept once: a
        plan of a long history folds hundreds of thousands of messages, and its users ask
        several times (some on the event loop). Built from ranges, at C speed."""
        indices: list[int] = []
        start = self.head_end
        for pin in sorted({i for i in self.pinned if self.head_end <= i < self.keep_from}):
            indices.extend(range(start, pin))
            start = pin + 1
        indices.extend(range(start, self.keep_from))
        return tuple(indices)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled without the cached `folded`: a plan goes to a worker process after the loop
        # read it, and an int per folded message is megabytes to pickle there and back.
        state = dict(self.__dict__)
        state.pop("folded", None)
        return state


@dataclass(frozen=True)
class MemoryItem:
    type: MemoryType
    content: str

    @property
    def identity(self) -> str:
        """What two items must share to count as the same: case, spacing and end punctuation
        aside. Cached in the instance's dict by hand: `functools.cached_property` takes a lock
        per first read (Python 3.11), a third of the cost for a fold's thousands of items."""
        cache = self.__dict__
        found: str | None = cache.get("identity")
        if found is None:
            found = cache["identity"] = normalize(self.content).rstrip(".。!！")
        return found


@dataclass(frozen=True)
class Verification:
    quality: Quality
    missing_key_info: tuple[str, ...]
    key_decisions_preserved: int
    key_decisions_total: int
    moved_to_memory: int = 0
    """Key entries with no room in the summary, written to the memory file instead."""


@dataclass(frozen=True)
class CompactionResult:
    """The outcome of one compaction.

    `messages[:prefix_len]` replaces `input[:keep_from]`; `messages[prefix_len:]` is
    `input[keep_from:]` itself (the same dict objects). With path "unchanged", `messages` is the
    input and `reason` says why.
    """

    messages: list[Message]
    path: ResultPath
    reason: str
    keep_from: int
    prefix_len: int
    summary_text: str
    summary_message: Message | None
    memory_items: tuple[MemoryItem, ...]
    verification: Verification | None
    tokens_before: int
    tokens_after: int
    fits: bool
    compaction_id: str
    duration_s: float
    folded_count: int = 0
    errors: tuple[str, ...] = field(default_factory=tuple)
    pinned_overflow: int = 0
    """Standing instructions this compaction had no room for in the summary (sent to the memory
    file; the summary says how many in one line)."""
    previews: tuple[Preview, ...] = ()
    """Path "selective": the input's messages replaced by previews, by index (all before
    `keep_from`, which is just past the last of them)."""
    model_calls: int = 0
    """Requests this compaction sent to the summarizing model (summary and memory: 2; none for
    previews, a fallback in cooldown, or too little to fold)."""

    @property
    def strategy(self) -> Literal["selective", "summary"]:
        """Which strategy acted: previews, or a summary (the extractive and dropped fallbacks
        included)."""
        return "selective" if self.path == "selective" else "summary"

    @property
    def compression_ratio(self) -> float:
        return self.tokens_after / self.tokens_before if self.tokens_before else 1.0
