"""Ledgers: what the folded messages did, collected by code rather than by the model.

The user's requests, a tool trail (every call: its name, clipped arguments and outcome: exit
status, the final exception or first error line, a failed command's last printed line, ids found
in the result; shell commands shown as `$ command`), the files touched, and the numbers and
identifiers the user and assistant mentioned (scan.py finds them in each text). Nothing is capped away here: the summary renders what fits its budget and the
rest goes to the memory file (see composition.py), so nothing collected is silently lost.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from itertools import accumulate, chain, filterfalse, islice
from operator import itemgetter

from compaction.instructions import Instruction, find_instructions
from compaction.marker import told_outcome
from compaction.mentions import Mentions, find_paths_each, scan_prose
from compaction.messages import Item, ToolCall
from compaction.scan import (
    call_commands_and_paths,
    command_key,
    fenced_commands,
    final_exception,
    first_error_line,
    first_lines_of,
    is_shell_tool,
    last_output_line,
    without_programs,
)
from compaction.text import clip_end, collapse_spaces, sentences_holding
from compaction.types import MemoryItem

ARGUMENTS_CHARS = 160
MAX_IDS_PER_RESULT = 12
MAX_FAILED_TESTS = 8

_EXIT_STATUS = re.compile(r"<returncode>(-?\d+)</returncode>|exit code[ :=]*(-?\d+)", re.I)
_RESULT_ID = re.compile(r'"(\w*(?:id|number))"\s*:\s*"([^"\\]{3,60})"')
# unittest's `FAIL: test_x (mod.Class)` (and ERROR:), pytest's `FAILED tests/x.py::test_y`.
_FAILED_TEST = re.compile(
    r"^(?:FAIL|ERROR): (\w+ \([\w.]+\))|^FAILED (\S+::\S+)|^(\S+::\S+) FAILED", re.MULTILINE
)
# "line 1414", "Lines 1414-1419", "L12": where something is in a file, not a value to show.
LINE_REFERENCE = re.compile(r"\b(?:lines?|ln|col(?:umn)?)\b\W{0,3}\d|^L\d", re.IGNORECASE)


@dataclass(frozen=True)
class Ledger:
    requests: tuple[str, ...] = ()
    trail: tuple[str, ...] = ()
    """One entry per tool call, oldest first: `name(arguments) → outcome`."""
    files: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    """Numbers with the words before them, and identifiers mixing letters and digits (a value
    the user wrote: the sentence it came in)."""
    instructions: tuple[Instruction, ...] = ()
    """What the user laid down (rules, constraints, decisions…), verbatim: the summary pins
    them in a section of their own (instructions.py)."""

    def requests_and_trail(self) -> list[str]:
        """What verification checks against the summary besides the key items."""
        return [*self.requests, *self.trail]

    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))

    def merged(self, newer: Ledger) -> Ledger:
        """This ledger followed by `newer`, each entry once (an update carries entries forward)."""
        return Ledger(
            **{
                f.name: tuple(dict.fromkeys((*getattr(self, f.name), *getattr(newer, f.name))))
                for f in fields(self)
            }
        )


# ---------------------------------------------------------------- extraction


class _Trail:
    """The tool trail, call by call: each call waits in `pending` (by id) for its outcome."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.outcomes: list[str] = []
        self.pending: dict[str, int] = {}

    def assistant(self, item: Item) -> tuple[list[str], list[str]]:
        """Add an assistant item's calls: the shell commands it wrote in its text (their paths
        are found for all items at once), and the paths its calls' arguments name."""
        if not item.joins and self.pending:
            # A new chat turn leaves earlier calls unanswered; a joining Responses call item
            # does not, its siblings' outputs come after it.
            self.pending = {}
        commands = fenced_commands(item.text) if "```" in item.text else []
        for command in commands:  # a fence opens every shell block: most turns have none
            self._call("shell", f"$ {command_key(command)}")
        paths: list[str] = []
        if item.calls:
            for call in item.functions:
                self._call(call.id or "", _describe(call))
                paths += call_commands_and_paths(call)[1]
        return commands, paths

    def _call(self, key: str, text: str) -> None:
        self.pending[key] = len(self.calls)
        self.calls.append(text)
        self.outcomes.append("")

    def answer(self, answers: Sequence[str], text: str) -> None:
        index = next((self.pending.pop(a) for a in answers if a in self.pending), None)
        if index is None:
            # Its call was folded earlier (or never seen): the outcome still counts.
            self._call("", "(an earlier call)")
            index = len(self.calls) - 1
            del self.pending[""]
        # A preview's own lines would read as a different outcome (its last line is the mark).
        told = told_outcome(text)
        self.outcomes[index] = outcome_of(text) if told is None else told

    def entries(self) -> tuple[str, ...]:
        trail = (f"{c} → {o}" if o else c for c, o in zip(self.calls, self.outcomes, strict=True))
        return tuple(dict.fromkeys(trail))


def _describe(call: ToolCall) -> str:
    """A call as the trail shows it: a shell command as `$ command`, else `name(k=v, …)`."""
    name = call.name or "?"
    commands, _ = call_commands_and_paths(call)
    if commands and is_shell_tool(name):
        return f"$ {command_key(commands[0])}"
    arguments = call.parsed()
    if arguments:
        shown = ", ".join(f"{k}={_short(v)}" for k, v in arguments.items())
    else:
        shown = collapse_spaces(call.arguments)
    return f"{name}({clip_end(shown, ARGUMENTS_CHARS)})"


def _short(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return clip_end(collapse_spaces(text), 60)


def outcome_of(result: str) -> str:
    """Exit status, error and ids of a tool result; "ok" when it says nothing else.

    The error is the exception that ended a Python traceback (of a chained one, the last raised),
    else the first line that reads as an error. A failed command (non-zero exit) also shows the
    last line it printed, which is where most tools say why (`pytest: command not found`)."""
    parts: list[str] = []
    status = _EXIT_STATUS.search(result)
    code = (status.group(1) or status.group(2)) if status else None
    if code is not None:
        parts.append(f"exit {code}")
    error = final_exception(result) or first_error_line(result)
    if error:
        parts.append(error)
    failed = failed_tests(result)
    if failed:
        parts.append("failed: " + ", ".join(failed))
    if code is not None and int(code) != 0:
        last = last_output_line(result)
        if last and not (error and last in error):
            parts.append(last)
    ids = list(dict.fromkeys(value for _, value in _RESULT_ID.findall(result)))
    if ids:
        parts.append("ids: " + ", ".join(ids[:MAX_IDS_PER_RESULT]))
    return "; ".join(parts) or "ok"


def failed_tests(result: str) -> list[str]:
    """The tests a run reports failed (MAX_FAILED_TESTS of them, then how many more)."""
    if "FAIL" not in result and "ERROR: " not in result:
        return []
    names = list(dict.fromkeys("".join(groups) for groups in _FAILED_TEST.findall(result)))
    if len(names) > MAX_FAILED_TESTS:
        return [*names[:MAX_FAILED_TESTS], f"{len(names) - MAX_FAILED_TESTS} more"]
    return names


Scanner = Callable[[Sequence[str]], list[Mentions]]
"""What finds the paths and values in prose texts: `mentions.scan_prose`, or a cache's scan."""


def build_ledger(
    items: Sequence[Item], indices: Iterable[int], *, scan: Scanner = scan_prose
) -> Ledger:
    """The ledger of the items at `indices` (earlier summaries are not mined).

    Each entry comes from one item; the ledger lists them in the order of their items. The
    prose of all the items is scanned at once (see mentions.py); the requests, files and
    values are then each gathered in one pass over all the items' findings, and only the tool
    trail, whose calls wait for their results, walks the items one by one."""
    chosen = [items[i] for i in indices]
    prose = [
        item
        for item in chosen
        if item.kind == "assistant"
        or (item.kind == "user" and not item.observation and not item.injected)
    ]  # item.is_prose, without two property calls per item
    mentions = scan([item.text for item in prose])
    paths = list(map(itemgetter(0), mentions))
    values = list(map(itemgetter(1), mentions))
    trail = _Trail()
    calling: list[tuple[int, list[str], list[str]]] = []  # (at, commands, argument paths)
    at = -1  # the index in `prose` of the last prose item seen
    for item in chosen:
        kind = item.kind
        if kind == "tool":
            trail.answer(item.answers, item.text)
        elif kind == "assistant":
            at += 1
            if item.observation:  # tool output: its prose is not mined
                paths[at] = values[at] = ()
                trail.answer(("shell",), item.text)
            else:
                commands, named = trail.assistant(item)
                if commands or named:
                    calling.append((at, commands, named))
        elif item.observation:
            trail.answer(("shell",), item.text)
        elif kind == "user" and not item.injected:
            at += 1
    # An item's files: its prose's, its commands', its calls' arguments'.
    in_commands = iter(
        find_paths_each([without_programs(c) for _, commands, _ in calling for c in commands])
    )
    for at, commands, named in calling:
        found = chain.from_iterable(islice(in_commands, len(commands)))
        paths[at] = (*paths[at], *found, *named)
    users = [at for at, item in enumerate(prose) if item.kind == "user"]
    requests = first_lines_of([prose[at].text for at in users])
    for at, request in zip(users, requests, strict=True):
        if values[at]:  # a sentence that is the whole request is listed as the request
            sentences = sentences_holding(prose[at].text, values[at])
            values[at] = tuple(sentence for sentence in sentences if sentence != request)
    files = dict.fromkeys(chain.from_iterable(paths))
    return Ledger(
        requests=tuple(dict.fromkeys(filter(None, requests))),
        trail=trail.entries(),
        files=tuple(files),
        values=tuple(filterfalse(files.__contains__, dict.fromkeys(chain.from_iterable(values)))),
        instructions=tuple(find_instructions(prose[at] for at in users)),
    )


# ---------------------------------------------------------------- overflow into memory

_OVERFLOW_TITLES = {
    "requests": "User requests in condensed turns",
    "trail": "Tool calls in condensed turns",
    "files": "Files touched in condensed turns",
    "values": "Numbers and identifiers mentioned in condensed turns",
}
OVERFLOW_ITEM_CHARS = 600


def overflow_items(overflow: Ledger) -> list[MemoryItem]:
    """Ledger entries the summary had no room for, as `fact` items for the memory file."""
    items: list[MemoryItem] = []
    for name, title in _OVERFLOW_TITLES.items():
        for chunk in _chunks(getattr(overflow, name), OVERFLOW_ITEM_CHARS):
            items.append(MemoryItem("fact", f"{title}: " + " | ".join(chunk)))
    return items


def is_overflow_item(content: str) -> bool:
    """True for a memory item that overflow_items wrote (ledger entries, checked as such)."""
    return content.startswith(tuple(f"{title}: " for title in _OVERFLOW_TITLES.values()))


def _chunks(entries: Sequence[str], limit: int) -> Iterator[Sequence[str]]:
    """`entries` in runs of about `limit` characters (each entry counts 3 more, its " | "); an
    entry longer than the limit is a run of its own.

    An entry joins a run while the run's size before it plus its length stays within the limit,
    that is while the running total of (length + 3) up to and including it stays within
    `limit + 3` of the run's start: a bound found by bisection, one per run, not one step per
    entry (the overflow of a long fold holds tens of thousands of entries)."""
    ends = list(accumulate([len(entry) + 3 for entry in entries], initial=0))
    start = 0
    while start < len(entries):
        stop = max(start + 1, bisect_right(ends, ends[start] + limit + 3) - 1)
        yield entries[start:stop]
        start = stop
