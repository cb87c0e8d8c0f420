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


_Limits = tuple[int, int | None, int | None]


class _Stages:
    """The entries rendered whole once; a stage renders again only the entries its limits clip
    (found from the longest down), so a stage that clips few costs a list copy and a join."""

    def __init__(self, entries: Sequence[_Entry]) -> None:
        self.entries = entries
        self.whole = [e.render((len(e.text), None, None)) for e in entries]
        by_kind: dict[str, list[tuple[int, int]]] = {}
        for i, entry in enumerate(entries):
            by_kind.setdefault(entry.kind, []).append((len(entry.text), i))
        self.by_text = {kind: sorted(sizes, reverse=True) for kind, sizes in by_kind.items()}
        self.by_calls = sorted(
            ((len(e.calls), i) for i, e in enumerate(entries) if e.calls), reverse=True
        )

    def clipped(self, limits: _Limits) -> set[int]:
        """The entries `limits` clip."""
        tool, assistant, user = limits
        clipped: set[int] = set()
        for kind, sizes in self.by_text.items():
            limit = {"tool": tool, "assistant": assistant, "user": user}.get(kind, assistant)
            if limit is not None:
                clipped.update(_longer(sizes, limit))
        if assistant is not None:
            clipped.update(_longer(self.by_calls, assistant))
        return clipped

    def render(self, limits: _Limits, clipped: set[int]) -> str:
        parts = list(self.whole)
        for i in clipped:
            parts[i] = self.entries[i].render(limits)
        return "\n\n".join(parts)


def _longer(sizes: Sequence[tuple[int, int]], limit: int) -> list[int]:
    """The indices of `sizes` (longest first) whose size exceeds `limit`."""
    found: list[int] = []
    for size, i in sizes:
        if size <= limit:
            break
        found.append(i)
    return found


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
    rendered = _Stages(entries)
    whole_too_long = False
    for limits in stages:
        clipped = rendered.clipped(limits)
        if whole_too_long and not clipped:
            continue  # the same text as a stage that did not fit
        text = rendered.render(limits, clipped)
        if estimator.count_text(text) <= max_tokens:
            return text
        whole_too_long = whole_too_long or not clipped
    users = [e.render(_STAGES[-1]) for e in entries if e.kind == "user"]
    omitted = len(entries) - len(users)
    text = f"[… {omitted} non-user messages omitted …]\n\n" + "\n\n".join(users)
    tokens = estimator.count_text(text)
    if tokens > max_tokens:
        text = clip_middle(text, int(len(text) * max_tokens / tokens * 0.95))
    return text
