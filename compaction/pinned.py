"""The pinned section of a summary: the user's standing instructions, under a budget, read back.

    ## Standing instructions from the user (verbatim, still in force)
    - [rule] Never delete anything under data/.
    - [constraint, superseded by a later statement] Budget cap is $300.
    - (3 more had no room here: they are in the memory file.)

Entries in rank order while they fit the section's budget (instructions.ranked); what has no room
goes to the memory file and the section counts it in one line. A later compaction reads the
section back and carries it forward whole, so neither a forgetful model nor a second compaction
drops what the user said.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from compaction.instructions import KINDS, MEMORY_TYPE, Instruction, Kind, ranked
from compaction.types import MemoryItem, TokenEstimator

PINNED_HEADING = "## Standing instructions from the user (verbatim, still in force)"

_ENTRY = re.compile(
    r"^- \[(rule|constraint|decision|preference|goal|fact)\] (.+)$",
    re.MULTILINE,
)
_SUPERSEDED = re.compile(
    r"^- \[(rule|constraint|decision|preference|goal|fact), superseded by a later statement\] (.+)$",
    re.MULTILINE,
)
_OVERFLOW = re.compile(r"^- \((\d+) more had no room here: they are in the memory file\.\)$", re.M)


@dataclass(frozen=True)
class Pinned:
    """The pinned section as rendered: its text, and what had no room (for the memory file)."""

    text: str
    left_out: tuple[Instruction, ...]
    overflow_total: int
    shown: tuple[Instruction, ...] = ()
    """Instructions sent to the memory file so far, this compaction's and earlier ones'."""

    def memory_items(self) -> list[MemoryItem]:
        return [MemoryItem(MEMORY_TYPE[i.kind], i.text) for i in self.left_out]


def render_pinned(
    instructions: Sequence[Instruction],
    *,
    budget: int,
    estimator: TokenEstimator,
    earlier_overflow: int = 0,
) -> Pinned:
    """The section within `budget` tokens: entries in rank order while they fit (a superseded
    one shown with the statement that changed it); the rest left out, counted in one line."""
    if not instructions:
        return Pinned("", (), earlier_overflow)
    shown: list[Instruction] = []
    order = ranked(instructions)
    entries = [_entry(i) for i in order]
    costs = [estimator.count_text(entry) + 2 for entry in entries]
    room = budget - estimator.count_text(PINNED_HEADING) - 2
    if earlier_overflow or sum(costs) > room:  # room for the line that counts the rest
        room -= estimator.count_text(_overflow_line(999_999)) + 2
    taken: list[str] = []
    left_out: list[Instruction] = []
    for instruction, entry, cost in zip(order, entries, costs, strict=True):
        if cost <= room:
            taken.append(entry)
            shown.append(instruction)
            room -= cost
        else:
            left_out.append(instruction)
    overflow = earlier_overflow + len(left_out)
    lines = [PINNED_HEADING, *taken]
    if overflow:
        lines.append(_overflow_line(overflow))
    text = "\n".join(lines)
    if not taken and estimator.count_text(text) > budget:
        text = ""  # no room even for the count: the memory file has them all
    return Pinned(text, tuple(left_out), overflow, tuple(shown))


def _entry(instruction: Instruction) -> str:
    if not instruction.superseded:
        return f"- [{instruction.kind}] {instruction.text}"
    return f"- [{instruction.kind}, superseded by a later statement] {instruction.text}"


def _overflow_line(count: int) -> str:
    return f"- ({count} more had no room here: they are in the memory file.)"


@dataclass(frozen=True)
class PinnedRead:
    instructions: tuple[Instruction, ...]
    overflow: int


def read_pinned(section: str) -> PinnedRead:
    """The instructions a rendered section holds, in its order, and its overflow count."""
    found: list[tuple[int, Instruction]] = []
    for match in _SUPERSEDED.finditer(section):
        kind = _as_kind(match.group(1))
        found.append((match.start(), Instruction(kind, match.group(2), superseded=True)))
    for match in _ENTRY.finditer(section):
        found.append((match.start(), Instruction(_as_kind(match.group(1)), match.group(2))))
    overflow = _OVERFLOW.search(section)
    return PinnedRead(
        tuple(i for _, i in sorted(found, key=lambda pair: pair[0])),
        int(overflow.group(1)) if overflow else 0,
    )


def _as_kind(name: str) -> Kind:
    for kind in KINDS:
        if kind == name:
            return kind
    return "fact"
