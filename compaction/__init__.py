"""compaction: decide what to fold in a chat history, summarize it, flush memory, verify.

A pure library: no HTTP, no environment, no files except the memory writer. Whatever needs I/O
(the summarizing LLM, the token counter) is a Protocol passed in.
"""

from __future__ import annotations

from compaction.marker import SUMMARY_MARKER, is_summary_message
from compaction.types import (
    Block,
    ChatLLM,
    CompactionResult,
    MemoryItem,
    Message,
    Plan,
    Round,
    Segments,
    TokenEstimator,
    Verification,
)

__all__ = [
    "SUMMARY_MARKER",
    "Block",
    "ChatLLM",
    "CompactionResult",
    "MemoryItem",
    "Message",
    "Plan",
    "Round",
    "Segments",
    "TokenEstimator",
    "Verification",
    "is_summary_message",
]
