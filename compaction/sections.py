"""The code-built sections of a summary body: rendered under a budget, and read back.

A summary body opens with the user's standing instructions (instructions.py), then the model's
text (or the fallback's note), followed by up to three sections that code writes and a later
compaction reads back, so that nothing they hold is lost when the summary is updated, and no
summary ever wraps an earlier one:

    ## Standing instructions from the user (verbatim, still in force)
    - [rule] … / - [constraint] … / …
    ## Task: the user's first request      (only when it was too large to keep as a message)
    <task>…</task>
    ## Ledger of the condensed turns (built by code)
    - User requests: / - Tool trail: / - Files touched: … / - Numbers and identifiers: …
    ## Also preserved
    - (decision) …

Requests and key items are served first (up to PRIORITY_SHARE of the budget), then the tool
trail, files and values share the rest; requests are taken oldest first, each once (a list a
person can follow), calls newest first when the room is short. What does not fit comes back as
overflow, for the memory file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import filterfalse

from compaction.instructions import Instruction
from compaction.ledger import LINE_REFERENCE, Ledger
from compaction.marker import TASK_HEADING
from compaction.pinned import PINNED_HEADING, read_pinned
from compaction.types import MemoryItem, TokenEstimator, as_memory_type

LEDGER_HEADING = "## Ledger of the condensed turns (built by code)"
ALSO_PRESERVED = "## Also preserved"
PRIORITY_SHARE = 0.6

_TITLES: dict[str, str] = {
    "requests": "User requests",
    "items": "Key items",
    "trail": "Tool trail (oldest first)",
    "files": "Files touched",
    "values": "Numbers and identifiers mentioned",
}
_INLINE = frozenset({"files"})
_READ_INLINE = frozenset({"files", "values"})  # values were inline before they kept sentences
_NEWEST_FIRST = frozenset({"trail"})
_TASK = re.compile(re.escape(TASK_HEADING) + r"\n<task>\n(.*?)\n</task>", re.DOTALL)
_ITEM = re.compile(r"^- \((decision|fact|preference|todo)\) (.+)$", re.MULTILINE)
_LIST_SECTION = re.compile(r"^- ([^:\n]+):\n((?:  - .*\n?)*)", re.MULTILINE)
_INLINE_SECTION = re.compile(r"^- ([^:\n]+): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Body:
    """A summary body read back: the lead text and what the code-built sections held."""

    lead: str
    task: str | None
    ledger: Ledger
    items: tuple[MemoryItem, ...]
    instructions: tuple[Instruction, ...] = ()
    pinned_overflow: int = 0
    """Standing instructions an earlier compaction sent to the memory file."""


def read_body(body: str) -> Body:
    """The parts of a summary body this library composed (a foreign text is all lead)."""
    pinned = read_pinned("")
    if body.startswith(PINNED_HEADING):
        end = body.find("\n\n")
        section, body = (body, "") if end < 0 else (body[:end], body[end + 2 :])
        pinned = read_pinned(section)
    starts = [i for i in (body.find(TASK_HEADING), body.find(LEDGER_HEADING)) if i >= 0]
    also = body.find("\n" + ALSO_PRESERVED)
    if also >= 0:
        starts.append(also)
    cut = min(starts) if starts else len(body)
    lead, rest = body[:cut].strip(), body[cut:]
    task = _TASK.search(rest)
    ledger_text = rest[rest.find(LEDGER_HEADING) :] if LEDGER_HEADING in rest else ""
    if ALSO_PRESERVED in ledger_text:
        ledger_text = ledger_text[: ledger_text.find(ALSO_PRESERVED)]
    items_text = rest[rest.find(ALSO_PRESERVED) :] if ALSO_PRESERVED in rest else ""
    items = tuple(MemoryItem(as_memory_type(t), c.strip()) for t, c in _ITEM.findall(items_text))
    return Body(
        lead,
        task.group(1) if task else None,
        _read_ledger(ledger_text),
        items,
        pinned.instructions,
        pinned.overflow,
    )


def _read_ledger(text: str) -> Ledger:
    by_title = {title: name for name, title in _TITLES.items()}
    found: dict[str, tuple[str, ...]] = {}
    for title, block in _LIST_SECTION.findall(text):
        if title in by_title:
            found[by_title[title]] = tuple(line[4:] for line in block.splitlines() if line)
    for title, line in _INLINE_SECTION.findall(text):
        if by_title.get(title) in _READ_INLINE:
            found[by_title[title]] = tuple(line.split(", "))
    return _text_ledger(found)


def render_task(task: str) -> str:
    return f"{TASK_HEADING}\n<task>\n{task.strip()}\n</task>"


@dataclass(frozen=True)
class Rendered:
    text: str
    overflow: Ledger
    left_out: tuple[MemoryItem, ...]


def render_sections(
    ledger: Ledger,
    items: tuple[MemoryItem, ...],
    *,
    estimator: TokenEstimator,
    max_tokens: int,
) -> Rendered:
    """The ledger and key items as markdown within `max_tokens`, and what did not fit."""
    queues: dict[str, list[str]] = {name: list(getattr(ledger, name, ())) for name in _TITLES}
    queues["items"] = [f"({i.type}) {i.content}" for i in items]
    # Line numbers ("around line 1414") are no values to show the model: kept in memory only.
    lines = list(filter(LINE_REFERENCE.search, queues["values"]))
    if lines:
        queues["values"] = list(filterfalse(LINE_REFERENCE.search, queues["values"]))
    for name in _NEWEST_FIRST:
        queues[name].reverse()
    taken: dict[str, list[str]] = {name: [] for name in _TITLES}
    remaining = max_tokens - estimator.count_text(LEDGER_HEADING + ALSO_PRESERVED) - 4
    priority = int(remaining * PRIORITY_SHARE)
    cursor = dict.fromkeys(_TITLES, 0)
    left = _fill(queues, taken, cursor, ("requests", "items"), priority, estimator)
    remaining -= priority - left
    _fill(queues, taken, cursor, tuple(_TITLES), remaining, estimator)
    for name in _NEWEST_FIRST:
        taken[name].reverse()
        queues[name].reverse()
    chosen_by = {name: frozenset(taken[name]) for name in _TITLES}
    # Filtered at C speed: the overflow of a long fold is tens of thousands of entries.
    overflow = {
        name: tuple(filterfalse(chosen_by[name].__contains__, queues[name]))
        for name in _TITLES
        if name != "items"
    }
    overflow["values"] += tuple(lines)
    left_out = tuple(i for i in items if f"({i.type}) {i.content}" not in chosen_by["items"])
    return Rendered(_render(taken), _text_ledger(overflow), left_out)


def _text_ledger(entries: dict[str, tuple[str, ...]]) -> Ledger:
    """The ledger of the text sections (the instructions have a section of their own)."""
    return Ledger(
        requests=entries.get("requests", ()),
        trail=entries.get("trail", ()),
        files=entries.get("files", ()),
        values=entries.get("values", ()),
    )


def _fill(
    queues: dict[str, list[str]],
    taken: dict[str, list[str]],
    cursor: dict[str, int],
    names: tuple[str, ...],
    budget: int,
    estimator: TokenEstimator,
) -> int:
    """Take entries of `names` in turn, one per section per pass, while they fit; the tokens left.

    `cursor` says how far each queue has been looked at (an entry too big is passed over)."""
    open_sections = [name for name in names if cursor[name] < len(queues[name])]
    for name in open_sections:
        if not taken[name]:
            budget -= estimator.count_text(_TITLES[name]) + 3
    while open_sections and budget > 0:
        for name in list(open_sections):
            entry = queues[name][cursor[name]]
            cost = estimator.count_text(entry) + 2
            if cost <= budget:
                taken[name].append(entry)
                budget -= cost
            cursor[name] += 1
            if cursor[name] >= len(queues[name]) or (cost > budget and budget < 8):
                open_sections.remove(name)
    return max(budget, 0)


def _render(taken: dict[str, list[str]]) -> str:
    lines = [LEDGER_HEADING]
    for name, title in _TITLES.items():
        entries = taken[name]
        if not entries or name == "items":
            continue
        if name in _INLINE:
            lines.append(f"- {title}: " + ", ".join(entries))
        else:
            lines.append(f"- {title}:")
            lines += [f"  - {entry}" for entry in entries]
    text = "\n".join(lines) if len(lines) > 1 else ""
    if taken["items"]:
        also = "\n".join([ALSO_PRESERVED, *(f"- {entry}" for entry in taken["items"])])
        text = f"{text}\n\n{also}" if text else also
    return text
