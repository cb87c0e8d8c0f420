"""Cut a message list into head, rounds and atomic blocks, in one pass.

The head is the leading system/developer messages. A round starts at each real user message (an
earlier summary is not one). Inside a round, an assistant message with `tool_calls` and the tool
messages answering it form one block that is kept or folded whole; every other item, malformed
ones included, is a block of its own and stays where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from compaction.marker import is_summary_message
from compaction.messages import is_message
from compaction.tokens import REPLY_PRIMING_TOKENS
from compaction.types import Block, Round, Segments, TokenEstimator

HEAD_ROLES = frozenset({"system", "developer"})


def is_head_message(item: Any) -> bool:
    return is_message(item) and item["role"] in HEAD_ROLES


def is_round_start(item: Any) -> bool:
    """A real user message: the start of a round. An earlier summary never is."""
    return is_message(item) and item["role"] == "user" and not is_summary_message(item)


def call_ids(item: Any) -> set[str]:
    """The ids of the tool calls an assistant message makes (empty for anything else)."""
    if not is_message(item) or item["role"] != "assistant":
        return set()
    calls = item.get("tool_calls")
    if not isinstance(calls, list):
        return set()
    return {c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)}


def answered_id(item: Any) -> str | None:
    """The call id a tool message answers, None for anything else."""
    if is_message(item) and item["role"] == "tool":
        value = item.get("tool_call_id")
        return value if isinstance(value, str) else None
    return None


def is_tool_message(item: Any) -> bool:
    return is_message(item) and item["role"] == "tool"


def tool_block_end(messages: Sequence[Any], start: int) -> int:
    """End of the block opened at `start`: just past the last tool message answering its calls.

    Consecutive tool messages stay pending until a non-tool message (the pairing rule that
    invariants.check_tool_pairing enforces); a stray tool message between two answers is inside
    the block, since cutting there would orphan the later answer. Trailing strays are not.
    """
    pending = call_ids(messages[start])
    end = start + 1
    i = start + 1
    while pending and i < len(messages) and is_tool_message(messages[i]):
        answered = answered_id(messages[i])
        if answered in pending:
            pending.discard(answered)
            end = i + 1
        i += 1
    return end


def split_blocks(
    messages: Sequence[Any], start: int, end: int, counts: Sequence[int]
) -> list[Block]:
    """The blocks of messages[start:end]; `counts` holds each message's tokens."""
    blocks: list[Block] = []
    i = start
    while i < end:
        stop = min(tool_block_end(messages, i), end)
        kind: Literal["tool", "message"] = "tool" if stop > i + 1 else "message"
        blocks.append(Block(i, stop, kind, sum(counts[i:stop])))
        i = stop
    return blocks


def round_starts(messages: Sequence[Any], head_end: int) -> list[int]:
    """Where each round begins: the first non-head index, then every real user message."""
    starts = [i for i in range(head_end, len(messages)) if is_round_start(messages[i])]
    if head_end < len(messages) and (not starts or starts[0] != head_end):
        starts.insert(0, head_end)
    return starts


def split(messages: Sequence[Any], estimator: TokenEstimator, tools: Any = None) -> Segments:
    """Segment `messages` for planning; never raises on malformed items."""
    counts = [estimator.count_message(m) for m in messages]
    head_end = 0
    while head_end < len(messages) and is_head_message(messages[head_end]):
        head_end += 1
    starts = round_starts(messages, head_end)
    rounds: list[Round] = []
    for start, end in zip(starts, [*starts[1:], len(messages)], strict=False):
        blocks = tuple(split_blocks(messages, start, end, counts))
        has_user = is_round_start(messages[start])
        rounds.append(Round(start, end, blocks, has_user, sum(b.tokens for b in blocks)))
    tools_tokens = estimator.count_tools(tools)
    return Segments(
        head_end=head_end,
        rounds=tuple(rounds),
        head_tokens=sum(counts[:head_end]),
        tools_tokens=tools_tokens,
        total_tokens=sum(counts) + tools_tokens + REPLY_PRIMING_TOKENS,
    )
