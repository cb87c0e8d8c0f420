"""Ledgers: what the folded messages did, collected by code rather than by the model.

Files read or written, shell commands run, error lines seen, the user's requests, and the numbers
and identifiers the user and assistant mentioned (scan.py finds them in each text). A ledger is
bounded (entries capped and clipped) and rendered under a token budget; what does not fit is
returned as overflow, which the compactor keeps in the memory file so that nothing collected here
is silently lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields

from compaction.messages import Item
from compaction.scan import (
    call_commands_and_paths,
    command_key,
    error_lines,
    fenced_commands,
    find_paths,
    first_lines,
    mentioned_values,
    strip_fences,
)
from compaction.types import MemoryItem, TokenEstimator

MAX_REQUESTS = 40
MAX_FILES = 400
MAX_COMMANDS = 400
MAX_ERRORS = 30
MAX_VALUES = 300


@dataclass(frozen=True)
class Ledger:
    requests: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    """Numbers of three or more digits and identifiers mixing letters and digits."""

    def key_entries(self) -> list[str]:
        """What verification checks against the summary: paths, commands, errors."""
        return [*self.files, *self.commands, *self.errors]

    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))


# ---------------------------------------------------------------- extraction


class _Collector:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.files: dict[str, None] = {}
        self.commands: dict[str, None] = {}
        self.errors: dict[str, None] = {}
        self.values: dict[str, None] = {}

    def add(self, item: Item) -> None:
        if item.kind == "tool" or item.observation:
            self.errors.update(dict.fromkeys(error_lines(item.text)))
        elif item.is_request:
            if request := first_lines(item.text):
                self.requests.append(request)
            self._add_prose(item.text)
        elif item.kind == "assistant":
            self._add_prose(item.text)
            for command in fenced_commands(item.text):
                self._add_command(command)
            for call in item.functions:
                commands, paths = call_commands_and_paths(call)
                for command in commands:
                    self._add_command(command)
                self.files.update(dict.fromkeys(paths))

    def _add_prose(self, text: str) -> None:
        self.files.update(dict.fromkeys(find_paths(strip_fences(text))))
        self.values.update(dict.fromkeys(mentioned_values(text)))

    def _add_command(self, command: str) -> None:
        if key := command_key(command):
            self.commands[key] = None
        self.files.update(dict.fromkeys(find_paths(command)))

    def ledger(self) -> Ledger:
        requests = self.requests
        if len(requests) > MAX_REQUESTS:
            # The first requests set the goal, the latest ones the current state.
            requests = requests[:10] + requests[len(requests) - (MAX_REQUESTS - 10) :]
        return Ledger(
            requests=tuple(requests),
            files=tuple(list(self.files)[:MAX_FILES]),
            commands=tuple(list(self.commands)[-MAX_COMMANDS:]),
            errors=tuple(list(self.errors)[-MAX_ERRORS:]),
            values=tuple(list(self.values)[:MAX_VALUES]),
        )


def build_ledger(items: Sequence[Item], indices: Iterable[int]) -> Ledger:
    """The ledger of the items at `indices` (earlier summaries are not mined)."""
    collector = _Collector()
    for i in indices:
        collector.add(items[i])
    return collector.ledger()


# ---------------------------------------------------------------- rendering

_SECTIONS: tuple[tuple[str, str], ...] = (
    ("requests", "User requests"),
    ("files", "Files touched"),
    ("errors", "Errors seen"),
    ("commands", "Commands run"),
    ("values", "Numbers and identifiers mentioned"),
)
_INLINE = frozenset({"files", "values"})
HEADING = "## Ledger of the condensed turns (built by code)"


def _format(name: str, entry: str) -> str:
    if name == "commands":
        return f"`{entry}`"
    return entry


def render_ledger(
    ledger: Ledger, *, estimator: TokenEstimator, max_tokens: int
) -> tuple[str, Ledger]:
    """The ledger as markdown within `max_tokens`, and the entries that did not fit.

    Sections are filled in turn, one entry each per pass, so a long section cannot starve the
    others.
    """
    if ledger.is_empty() or max_tokens <= 0:
        return "", ledger
    remaining = max_tokens - estimator.count_text(HEADING) - 2
    queues = {name: list(getattr(ledger, name)) for name, _ in _SECTIONS}
    taken: dict[str, list[str]] = {name: [] for name, _ in _SECTIONS}
    open_sections = [name for name, _ in _SECTIONS if queues[name]]
    for name in open_sections:
        remaining -= estimator.count_text(dict(_SECTIONS)[name]) + 3
    while open_sections and remaining > 0:
        for name in list(open_sections):
            entry = _format(name, queues[name][len(taken[name])])
            cost = estimator.count_text(entry) + 1
            if cost > remaining:
                open_sections.remove(name)
                continue
            taken[name].append(queues[name][len(taken[name])])
            remaining -= cost
            if len(taken[name]) == len(queues[name]):
                open_sections.remove(name)
    text = _render_taken(taken)
    overflow = Ledger(**{name: tuple(queues[name][len(taken[name]) :]) for name, _ in _SECTIONS})
    return text, overflow


def _render_taken(taken: dict[str, list[str]]) -> str:
    lines = [HEADING]
    for name, title in _SECTIONS:
        entries = [_format(name, e) for e in taken[name]]
        if not entries:
            continue
        if name in _INLINE:
            lines.append(f"- {title}: " + ", ".join(entries))
        else:
            lines.append(f"- {title}:")
            lines += [f"  - {entry}" for entry in entries]
    return "\n".join(lines) if len(lines) > 1 else ""


# ---------------------------------------------------------------- overflow into memory

_OVERFLOW_TITLES = {
    "files": "Files touched in condensed turns",
    "commands": "Commands run in condensed turns",
    "errors": "Errors seen in condensed turns",
    "values": "Numbers and identifiers mentioned in condensed turns",
}
OVERFLOW_ITEM_CHARS = 600


def overflow_items(overflow: Ledger) -> list[MemoryItem]:
    """Ledger entries the summary had no room for, as `fact` items for the memory file.

    Requests are left out: the transcript-based extraction covers what the user asked for.
    """
    items: list[MemoryItem] = []
    for name, title in _OVERFLOW_TITLES.items():
        entries = [_format(name, e) for e in getattr(overflow, name)]
        for chunk in _chunks(entries, OVERFLOW_ITEM_CHARS):
            items.append(MemoryItem("fact", f"{title}: " + "; ".join(chunk)))
    return items


def is_overflow_item(content: str) -> bool:
    """True for a memory item that overflow_items wrote (ledger entries, checked as such)."""
    return content.startswith(tuple(f"{title}: " for title in _OVERFLOW_TITLES.values()))


def _chunks(entries: Sequence[str], limit: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for entry in entries:
        if chunk and size + len(entry) > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += len(entry) + 2
    if chunk:
        yield chunk
