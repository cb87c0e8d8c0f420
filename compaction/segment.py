"""Cut a message list into head, rounds and atomic blocks, in one pass over its Items.

The head is the leading `head` items (system/developer messages), or everything up to the latest
sealed compaction of the provider's (a Responses `compaction` item, an Anthropic `compaction`
block). A round starts at each request
the user wrote: an earlier summary is not one, and neither is tool output sent as a user message
(`Item.observation`), so a coding agent's whole task is one round however many commands it runs. Inside a round, an item with calls and the items answering
them form one block that is kept or folded whole; `lead` items just before it belong to it, and
so do further `joins` call items before the first answer (Responses sends one item per call).
An assistant turn without calls followed by a tool observation sent as a user message is one
block too. Every other item, malformed ones included, is a block of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from compaction.marker import TASK_HEADING
from compaction.messages import CHAT, Item, Shape, injected_kinds, read_items
from compaction.tokens import REPLY_PRIMING_TOKENS, count_messages
from compaction.types import Block, Message, Round, Segments, TokenEstimator, Tools


def block_end(items: Sequence[Item], start: int) -> int:
    """End of the block that starts at `start`.

    Results stay pending until an item that is neither a result nor a call (the pairing rule
    invariants.find_pairing_problems enforces); a stray result between two answers is inside the
    block, since cutting there would orphan the later answer. Trailing strays are not.
    """
    first = _skip_leads(items, start)
    if first >= len(items):
        return len(items)
    leading = items[first]
    if leading.kind != "assistant" and not leading.calls:
        return first + 1  # nothing for later items to answer
    call_ids = leading.call_ids if leading.calls else ()  # most items make no call: no tuple
    if leading.kind == "assistant" and not call_ids:
        # An agent that acts in its text (mini-swe-agent) gets the outcome as the next user
        # message: the action and its observation stay together, like a call and its result.
        glued = first + 1
        return glued + 1 if glued < len(items) and items[glued].observation else glued
    pending = set(call_ids)
    end = first + 1
    i = first + 1
    answering = False
    while pending and i < len(items):
        item = items[i]
        if item.kind == "tool":
            answering = True
            hit = pending.intersection(item.answers)
            if hit:
                pending -= hit
                end = i + 1
            i += 1
            continue
        following = _skip_leads(items, i)
        if answering or following >= len(items) or not _joins(items[following]):
            break
        pending.update(items[following].call_ids)
        end = i = following + 1
    return end


def _joins(item: Item) -> bool:
    return item.joins and bool(item.call_ids)


def _skip_leads(items: Sequence[Item], start: int) -> int:
    """The first index at or after `start` that is not a lead item."""
    while start < len(items) and items[start].lead:
        start += 1
    return start


def split_rounds(
    items: Sequence[Item], starts: Sequence[int], counts: Sequence[int]
) -> list[Round]:
    """The rounds that begin at `starts`, each cut into its blocks; `counts` holds each
    message's tokens. One loop for all of them: a history has a round per request."""
    rounds: list[Round] = []
    for start, end in zip(starts, [*starts[1:], len(items)], strict=False):
        blocks: list[Block] = []
        i = start
        while i < end:
            item = items[i]
            # Most items neither lead nor call (every one of a chat without tools): their blocks
            # are found here without `block_end`'s general walk; the result is the same.
            if item.lead or item.calls:
                stop = min(block_end(items, i), end)
                tool = stop > i + 1 and any(_acts(items[k]) for k in range(i, stop))
            elif item.kind == "assistant" and i + 1 < end and items[i + 1].observation:
                stop, tool = i + 2, True  # an action in text and its observation
            else:
                stop, tool = i + 1, False
            tokens = counts[i] if stop == i + 1 else sum(counts[i:stop])
            kind = "tool" if tool else "message"
            blocks.append(_new(Block, (i, stop, kind, tokens, item.kind in _USER_LED)))
            i = stop
        # The blocks cover the round exactly: their tokens are the round's messages' tokens.
        has_user, tokens = items[start].is_request, sum(counts[start:end])
        rounds.append(_new(Round, (start, end, tuple(blocks), has_user, tokens)))
    return rounds


_USER_LED = frozenset({"user", "summary"})
_new = tuple.__new__
"""A Block or a Round from all its fields in order, as the class builds it less its keyword
handling (one per message)."""


def _acts(item: Item) -> bool:
    """A call with an id, or a tool observation (call_ids built only when there are calls)."""
    return bool(item.calls and item.call_ids) or item.observation


def round_starts(items: Sequence[Item], head_end: int) -> list[int]:
    """Where each round begins: the first non-head index, then every request the user wrote."""
    starts = [i for i in range(head_end, len(items)) if items[i].is_request]
    if head_end < len(items) and (not starts or starts[0] != head_end):
        starts.insert(0, head_end)
    return starts


def find_task(items: Sequence[Item], head_end: int) -> int | None:
    """The conversation's first request, unless an earlier summary already quotes it."""
    for i in range(head_end, len(items)):
        item = items[i]
        if item.kind == "summary" and TASK_HEADING in item.text:
            return None
        if item.is_request:
            return i
    return None


def find_context(
    items: Sequence[Item], head_end: int, counts: Sequence[int]
) -> tuple[tuple[int, int], ...]:
    """The latest injected-context turn of each kind after the head, with its tokens (see
    Segments.context)."""
    latest: dict[str, int] = {}
    for i in range(len(items) - 1, head_end - 1, -1):
        if items[i].injected:
            for kind in injected_kinds(items[i].text):
                latest.setdefault(kind, i)
    return tuple((i, counts[i]) for i in sorted(set(latest.values())))


def head_end(items: Sequence[Item]) -> int:
    """Just past the leading head items, or past the latest sealed compaction (Item.sealed) when
    there is one: what the provider compacted, and everything the client sent before it, stay
    as sent (a summary of ours would follow it; folding it would lose what only the provider
    can read)."""
    end = 0
    while end < len(items) and items[end].kind == "head":
        end += 1
    for index in range(len(items) - 1, end - 1, -1):
        if items[index].sealed:
            return index + 1
    return end


def split(
    messages: Sequence[Message],
    estimator: TokenEstimator,
    tools: Tools = None,
    *,
    shape: Shape = CHAT,
    items: Sequence[Item] | None = None,
    counts: Sequence[int] | None = None,
) -> Segments:
    """Segment `messages` for planning; never raises on malformed items.

    `items` is `read_items(messages, shape)` and `counts` is `count_messages(messages,
    estimator)` when the caller already has them.
    """
    if items is None:
        items = read_items(messages, shape)
    if counts is None:
        counts = count_messages(messages, estimator)
    head = head_end(items)
    starts = round_starts(items, head)
    rounds = split_rounds(items, starts, counts)
    tools_tokens = estimator.count_tools(tools)
    return Segments(
        head_end=head,
        rounds=tuple(rounds),
        head_tokens=sum(counts[:head]),
        tools_tokens=tools_tokens,
        total_tokens=sum(counts) + tools_tokens + REPLY_PRIMING_TOKENS,
        task=find_task(items, head),
        context=find_context(items, head, counts),
    )
