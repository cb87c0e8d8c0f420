"""The fixed prefix that marks a summary this library inserted.

A later compaction must recognise its own earlier summary (to update it rather than summarize a
summary), so the marker never changes between releases. Each message shape finds the text of a
message and asks `is_summary_text`; `messages.is_summary_message` is the one predicate on
messages.
"""

from __future__ import annotations

SUMMARY_MARKER = "[compaction-proxy: summary of earlier conversation]"


def is_summary_text(text: str) -> bool:
    """True for the text of a summary this library inserted."""
    return text.startswith(SUMMARY_MARKER)


TASK_HEADING = "## Task: the user's first request"
"""Opens the section in which a summary quotes the conversation's task (when it was too large to
keep as a message); a later compaction looks for it to know the task lives in the summary."""
