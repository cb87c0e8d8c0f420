"""The fixed prefix that marks a summary this library inserted, and its one predicate.

A later compaction must recognise its own earlier summary (to update it rather than summarize a
summary), so the marker never changes between releases and nothing else tests for summaries.
"""

from __future__ import annotations

from typing import Any

SUMMARY_MARKER = "[compaction-proxy: summary of earlier conversation]"


def is_summary_message(message: Any) -> bool:
    """True for a message this library inserted as a summary of folded history."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    content = message.get("content")
    return isinstance(content, str) and content.startswith(SUMMARY_MARKER)
