"""The fixed marks that tell what this library inserted: a summary, and a tool output's preview.

A later compaction must recognise its own earlier summary (to update it rather than summarize a
summary), so the marker never changes between releases. Each message shape finds the text of a
message and asks `is_summary_text`; `messages.is_summary_message` is the one predicate on
messages. Likewise a preview (compaction.selective) ends in one line that opens with
`PREVIEW_MARK` and tells what the whole output was: a later compaction never reduces it again,
and a summary that folds it records the outcome it tells (`told_outcome`), not its own.
"""

from __future__ import annotations

import re

SUMMARY_MARKER = "[compaction-proxy: summary of earlier conversation]"


def is_summary_text(text: str) -> bool:
    """True for the text of a summary this library inserted."""
    return text.startswith(SUMMARY_MARKER)


TASK_HEADING = "## Task: the user's first request"
"""Opens the section in which a summary quotes the conversation's task (when it was too large to
keep as a message); a later compaction looks for it to know the task lives in the summary."""


PREVIEW_MARK = "[tool output cut to a preview by the compaction proxy:"
"""Opens a preview's last line (`is_preview_text`); a preview is never reduced again."""

_PREVIEW_LINE = re.compile(
    re.escape(PREVIEW_MARK)
    + r" (?:outcome: ([^\n]*); )?\d+ characters, \d+ lines in full; the rest was folded"
)


def preview_line(outcome: str, characters: int, lines: int) -> str:
    """A preview's last line: the outcome of the whole output ("ok" is not told), its size, and
    where the rest went."""
    told = "" if outcome == "ok" else f"outcome: {outcome}; "
    return (
        f"{PREVIEW_MARK} {told}{characters} characters, {lines} lines in full; the rest was "
        "folded to save context and is archived verbatim (the `recall` tool returns it where "
        "offered).]"
    )


def _last_line(text: str) -> str:
    stripped = text.rstrip()
    return stripped[stripped.rfind("\n") + 1 :]


def is_preview_text(text: str) -> bool:
    """True for a preview: its last line is a preview's line (an output that merely quotes the
    mark, as a search through this library's code would, is none)."""
    return PREVIEW_MARK in text and _PREVIEW_LINE.match(_last_line(text)) is not None


def told_outcome(text: str) -> str | None:
    """The outcome a preview tells of its whole output ("ok" when it tells none; of a turn of
    several previews, all they tell); None for a text that is not a preview."""
    if not is_preview_text(text):
        return None
    told = [found[1] for found in _PREVIEW_LINE.finditer(text) if found[1]]
    return "; ".join(dict.fromkeys(told)) or "ok"
