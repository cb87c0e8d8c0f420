"""The rules a compacted message list must keep, checked in code after every compaction.

A result answers a call of the nearest preceding run of call items, with only results in between;
every call is answered before the next item that is neither a result nor a call (for chat: a tool
message answers the nearest preceding assistant message, only tool messages in between). A
compaction keeps the head, the pinned messages and the kept tail as the very same objects,
inserts exactly one summary, and introduces no pairing problem the original did not already have.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from compaction.messages import CHAT, Item, Shape, read_items
from compaction.types import Message, Plan


class PairingProblem(NamedTuple):
    kind: str  # "orphan result" | "unanswered call"
    call_id: str | None
    at: int

    def describe(self) -> str:
        return f"message {self.at}: {self.kind} {self.call_id!r}"


def find_pairing_problems(
    messages: Sequence[Message], *, shape: Shape = CHAT, items: Sequence[Item] | None = None
) -> list[PairingProblem]:
    """Every orphan result and every call left unanswered, in order."""
    if items is None:
        items = read_items(messages, shape)
    problems: list[PairingProblem] = []
    pending: dict[str, int] = {}
    answering = False
    for index, item in enumerate(items):
        if item.kind == "tool":
            answering = True
            for answered in item.answers or (None,):
                if answered is not None and answered in pending:
                    del pending[answered]
                else:
                    problems.append(PairingProblem("orphan result", answered, index))
            continue
        if item.lead:
            continue  # glued to the next item: neither ends nor starts a run of calls
        # Most items make no call and follow none left open: no tuple or dict built for them.
        call_ids = item.call_ids if item.calls else ()
        if item.joins and call_ids and pending and not answering:
            pending.update(dict.fromkeys(sorted(call_ids), index))
            continue
        if pending:
            problems += [PairingProblem("unanswered call", cid, at) for cid, at in pending.items()]
        pending = dict.fromkeys(sorted(call_ids), index) if call_ids else {}
        answering = False
    problems += [PairingProblem("unanswered call", cid, at) for cid, at in pending.items()]
    return problems


def check_tool_pairing(messages: Sequence[Message], *, shape: Shape = CHAT) -> list[str]:
    """Pairing problems of `messages` as readable lines; [] when every call has its result."""
    return [p.describe() for p in find_pairing_problems(messages, shape=shape)]


def check_compacted(
    original: Sequence[Message], compacted: Sequence[Message], plan: Plan, *, shape: Shape = CHAT
) -> list[str]:
    """What is wrong with `compacted` as the result of applying `plan` to `original`."""
    if plan.previews:
        return _check_previewed(original, compacted, plan, shape)
    if plan.keep_from == plan.head_end and not plan.pinned:
        expected: list[Message] = list(original)
        problems = _check_same(expected, compacted, "unchanged")
        return problems + _new_pairing_problems(original, compacted, shape)
    head = list(original[: plan.head_end])
    pinned = [original[i] for i in plan.pinned]
    tail = list(original[plan.keep_from :])
    want = len(head) + 1 + len(pinned) + len(tail)
    if len(compacted) != want:
        return [f"expected {want} messages (head, summary, pinned, tail), got {len(compacted)}"]
    problems = _check_same(head, compacted[: len(head)], "head")
    if not shape.is_summary(compacted[len(head)]):
        problems.append(f"message {len(head)}: expected the summary message")
    start = len(head) + 1
    problems += _check_same(pinned, compacted[start : start + len(pinned)], "pinned")
    problems += _check_same(tail, compacted[start + len(pinned) :], "kept tail")
    return problems + _new_pairing_problems(original, compacted, shape)


def _check_previewed(
    original: Sequence[Message], compacted: Sequence[Message], plan: Plan, shape: Shape
) -> list[str]:
    """A selective plan: every message the original object but the previews, each in its
    message's place with the same tool call ids."""
    if len(compacted) != len(original):
        return [f"expected {len(original)} messages (previews in place), got {len(compacted)}"]
    previewed = dict(plan.previews)
    problems = [
        f"message {i}: not the original object"
        for i, (want, got) in enumerate(zip(original, compacted, strict=True))
        if i not in previewed and want is not got
    ]
    for index, message in previewed.items():
        if compacted[index] is not message:
            problems.append(f"message {index}: expected its preview")
        elif shape.read(message).answers != shape.read(original[index]).answers:
            problems.append(f"message {index}: its preview answers other calls")
    return problems + _new_pairing_problems(original, compacted, shape)


def _check_same(expected: Sequence[Message], actual: Sequence[Message], part: str) -> list[str]:
    if len(expected) != len(actual):
        return [f"{part}: expected {len(expected)} messages, got {len(actual)}"]
    return [
        f"{part} message {i}: not the original object"
        for i, (want, got) in enumerate(zip(expected, actual, strict=False))
        if want is not got
    ]


def _new_pairing_problems(
    original: Sequence[Message], compacted: Sequence[Message], shape: Shape
) -> list[str]:
    """Pairing problems of `compacted` beyond those `original` already had (malformed input).

    The compacted list is checked first: only when it has a problem (rare) is the original,
    which is the whole history, read to tell an old problem from a new one."""
    found = find_pairing_problems(compacted, shape=shape)
    if not found:
        return []
    before = Counter((p.kind, p.call_id) for p in find_pairing_problems(original, shape=shape))
    new: list[str] = []
    for problem in found:
        key = (problem.kind, problem.call_id)
        if before[key] > 0:
            before[key] -= 1
        else:
            new.append("new pairing problem: " + problem.describe())
    return new
