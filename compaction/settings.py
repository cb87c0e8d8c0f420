"""The library's settings and the one place each default lives.

The proxy's configuration section mirrors these fields; it takes its defaults from a default
CompactionSettings, so a default changes in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TRIGGER_RATIO = 0.85
"""Compact when the request reaches this share of the context window."""

TRIGGER_TOKENS: int | None = None
"""Or compact at this many tokens, whichever comes first (None: the ratio alone). With 1M-token
windows the ratio's trigger sits where long-context recall has long fallen off and every request
costs the most; agents' own harnesses compact at 100-200k there (plan.Trigger)."""

TARGET_RATIO = 0.35
"""Aim the compacted request at this share of the window, well below the trigger: each
compaction breaks the prompt cache once (the new prefix is read at the full input price), and
the room to the trigger (0.50 of the window) is how many requests go by before the next
(bench.cost at 8k: 0.6 compacted a coding agent every 3-5 requests; 0.45 -> 0.35 took the
conversations that compact from 0.819 to 0.797 of direct, with the canaries at 100% and
bench.retention unchanged but for a tenth of a point of paths; docs/cost.md)."""

KEEP_RECENT_ROUNDS = 5
"""Rounds (a user message and what follows it) kept verbatim when they fit."""

SUMMARY_MAX_TOKENS = 2000
"""The largest summary message a compaction inserts."""

SUMMARY_WINDOW_RATIO = 0.15
"""The summary never takes more than this share of the window (small windows)."""

TRANSCRIPT_MAX_TOKENS = 24000
"""The largest transcript of folded messages sent to the summarizer."""

TOOL_OUTPUT_CLIP_CHARS = 2000
"""A tool output in the transcript is clipped to this many characters before anything else."""

MEMORY_MAX_TOKENS = 1500
"""The answer budget of the memory-extraction call."""

STRICT_ALTERNATION = False
"""Off: the summary is a user message that may precede another user message, as OpenAI accepts.
On: nothing is pinned after the summary and the kept part opens with an assistant turn, for
backends whose chat templates refuse two user (or assistant) messages in a row."""

PINNED_RATIO = 0.10
"""The user's standing instructions may take this share of the window in the summary message
(on top of the summary's own budget); what exceeds it goes to the memory file, counted."""

Strategy = Literal["summary", "selective", "hybrid"]
"""How a compaction makes room: `summary` folds old turns into a summary message; `selective`
reduces old tool outputs to previews (compaction.selective), no model call; `hybrid` reduces
first and summarizes only when the previews alone are not enough (plan.preview_slack)."""

STRATEGY: Strategy = "hybrid"

LLM_TIMEOUT_S = 60.0
"""How long one summarizer call may take before the compaction falls back."""


@dataclass(frozen=True)
class CompactionSettings:
    trigger_ratio: float = TRIGGER_RATIO
    trigger_tokens: int | None = TRIGGER_TOKENS
    target_ratio: float = TARGET_RATIO
    keep_recent_rounds: int = KEEP_RECENT_ROUNDS
    summary_max_tokens: int = SUMMARY_MAX_TOKENS
    summary_window_ratio: float = SUMMARY_WINDOW_RATIO
    transcript_max_tokens: int = TRANSCRIPT_MAX_TOKENS
    tool_output_clip_chars: int = TOOL_OUTPUT_CLIP_CHARS
    memory_max_tokens: int = MEMORY_MAX_TOKENS
    llm_timeout_s: float = LLM_TIMEOUT_S
    strict_alternation: bool = STRICT_ALTERNATION
    pinned_ratio: float = PINNED_RATIO
    strategy: Strategy = STRATEGY
