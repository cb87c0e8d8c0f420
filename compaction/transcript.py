"""The folded messages as a bounded transcript for the summarizer.

Tool outputs are clipped first, then assistant text; user requests last and never dropped.
Earlier summaries are left out: the update request carries them separately.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compaction.messages import Item
from compaction.settings import TOOL_OUTPUT_CLIP_CHARS
from compaction.text import clip_middle
from compaction.types import TokenEstimator

# Successive clipping limits in characters: (tool output, assistant text, user request).
# Tool outputs give way first, then assistant prose; user requests only at the end, and only
# down to a readable head and tail, never away.
_STAGES: tuple[tuple[int, int | None, int | None], ...] = (
    (TOOL_OUTPUT_CLIP_CHARS, None, None),
    (800, 4000, None),
    (300, 1500, None),
    (120, 500, 4000),
    (60, 200, 1500),
    (0, 100, 600),
)


@dataclass(frozen=True)
class _Entry:
    kind: str  # "user" | "assistant" | "tool" | "other"
    label: str
    text: str
    calls: str = ""

    def render(self, limits: tuple[int, int | None, int | None]) -> str:
        tool_limit, assistant_limit, user_limit = limits
        limit = {"tool": tool_limit, "assistant": assistant_limit, "user": user_limit}.get(
            self.kind, assistant_limit
        )
        body = self.text if limit is None else clip_middle(self.text, limit)
        if self.calls:
            calls = (
                self.calls if assistant_limit is None else clip_middle(self.calls, assistant_limit)
            )
            body = f"{body}\n{calls}" if body else calls
        return f"[{self.label}]\n{body}".rstrip()


def _entry(item: Item) -> _Entry:
    if item.is_malformed:
        return _Entry("other", "malformed item", clip_middle(item.text, 200))
    if item.kind == "tool":
        return _Entry("tool", "tool result", item.text)
    if item.observation:
        return _Entry("tool", "command output", item.text)
    if item.kind == "user":
        return _Entry("user", "user", item.text)
    if item.kind == "assistant":
        calls = "\n".join(f"→ {c.name}({c.arguments})" for c in item.functions)
        return _Entry("assistant", "assistant", item.text, calls)
    return _Entry("other", item.label, item.text)


def render_transcript(
    items: Sequence[Item],
    indices: Iterable[int],
    *,
    estimator: TokenEstimator,
    max_tokens: int,
    tool_output_clip_chars: int = TOOL_OUTPUT_CLIP_CHARS,
) -> str:
    """The items at `indices` as a labelled transcript of at most about `max_tokens` tokens.

    Each stage clips harder until the transcript fits; if even the last stage does not, only the
    user requests (clipped) remain, and then the whole text is cut in the middle.
    """
    entries = [_entry(items[i]) for i in indices if items[i].kind != "summary"]
    stages = [(tool_output_clip_chars, None, None), *_STAGES[1:]]
    text = ""
    for limits in stages:
        text = "\n\n".join(e.render(limits) for e in entries)
        if estimator.count_text(text) <= max_tokens:
            return text
    users = [e.render(_STAGES[-1]) for e in entries if e.kind == "user"]
    omitted = len(entries) - len(users)
    text = f"[… {omitted} non-user messages omitted …]\n\n" + "\n\n".join(users)
    tokens = estimator.count_text(text)
    if tokens > max_tokens:
        text = clip_middle(text, int(len(text) * max_tokens / tokens * 0.95))
    return text
