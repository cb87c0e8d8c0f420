"""The folded messages as a bounded transcript for the summarizer.

Tool outputs are clipped first, then assistant text; user requests last and never dropped.
Earlier summaries are left out: the update request carries them separately.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate, compress, repeat
from operator import eq
from typing import NamedTuple

from compaction.messages import Item
from compaction.settings import TOOL_OUTPUT_CLIP_CHARS
from compaction.text import clip_middle
from compaction.tokens import HeuristicEstimator
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


class _Entry(NamedTuple):
    """One transcript entry (a tuple: there is one per folded message, built in a hot loop)."""

    kind: str  # "user" | "assistant" | "tool" | "other"
    label: str
    text: str
    calls: str = ""

    def render(self, limits: tuple[int, int | None, int | None]) -> str:
        assistant_limit = limits[1]
        limit = _limit(limits, self.kind)
        body = self.text if limit is None else clip_middle(self.text, limit)
        if self.calls:
            calls = (
                self.calls if assistant_limit is None else clip_middle(self.calls, assistant_limit)
            )
            body = f"{body}\n{calls}" if body else calls
        return f"[{self.label}]\n{body}".rstrip()


_Limits = tuple[int, int | None, int | None]


class _Stages:
    """The entries rendered whole once, when a stage is first rendered; a stage renders again
    only the entries its limits clip, so a stage that clips few costs a list copy and a join.
    `shortest` bounds a stage's length from below without rendering it, so a stage that cannot
    fit is neither joined nor counted.

    The entries are held by kind, sorted by length: the ones a limit clips are the tail past
    one bisection, and the lengths they lose at least are read from running sums, so neither
    costs a step per entry."""

    def __init__(self, entries: Sequence[_Entry]) -> None:
        self.entries = entries
        self._whole: list[str] | None = None
        kinds, labels, texts, calls = zip(*entries, strict=True) if entries else ((), (), (), ())
        sizes = list(map(len, texts))
        # Each entry's least rendered length: its label and its text without trailing spaces.
        kept = list(map(len, map(str.rstrip, texts)))
        self.least_total = (
            sum(map(len, labels)) + sum(kept) + 2 * len(entries) + 2 * max(len(entries) - 1, 0)
        )
        every = range(len(entries))
        self.by_text = {
            kind: _BySize(sizes, list(compress(every, map(eq, kinds, repeat(kind)))), kept)
            for kind in dict.fromkeys(kinds)
        }
        self.by_calls = _BySize(list(map(len, calls)), list(compress(every, calls)), kept)

    def clipped(self, limits: _Limits) -> set[int]:
        """The entries `limits` clip."""
        assistant = limits[1]
        clipped: set[int] = set()
        for kind, sizes in self.by_text.items():
            limit = _limit(limits, kind)
            if limit is not None:
                clipped.update(sizes.longer(limit))
        if assistant is not None:
            clipped.update(self.by_calls.longer(assistant))
        return clipped

    def shortest(self, limits: _Limits) -> int:
        """A lower bound of the length of `render(limits, clipped)`.

        An entry whose text is clipped keeps at least the head of it (two thirds of the limit)
        and the marker after it, which trailing whitespace cannot be; one whose text is not
        clipped (only its calls) keeps its text; an entry renders with its label either way."""
        total = self.least_total
        for kind, sizes in self.by_text.items():
            limit = _limit(limits, kind)
            if limit is not None:
                count, kept = sizes.past(limit)
                total += count * (max(limit, 0) * 2 // 3) - kept
        return total

    def render(self, limits: _Limits, clipped: set[int]) -> str:
        if self._whole is None:
            self._whole = [e.render((len(e.text), None, None)) for e in self.entries]
        parts = list(self._whole)
        for i in clipped:
            parts[i] = self.entries[i].render(limits)
        return "\n\n".join(parts)


class _BySize:
    """Some entries (`chosen`) by the length of one of their texts (`sizes`, of every entry),
    shortest first, with the running sum of a weight of theirs in the same order."""

    def __init__(self, sizes: list[int], chosen: list[int], weights: list[int]) -> None:
        # A stable sort by length: entries of one length stay in their order.
        self.indices = sorted(chosen, key=sizes.__getitem__)
        self.sizes = list(map(sizes.__getitem__, self.indices))
        self.weights = list(accumulate(map(weights.__getitem__, self.indices), initial=0))

    def longer(self, limit: int) -> list[int]:
        """The entries whose text is longer than `limit`."""
        return self.indices[bisect_right(self.sizes, limit) :]

    def past(self, limit: int) -> tuple[int, int]:
        """How many entries are longer than `limit`, and the sum of their weights."""
        cut = bisect_right(self.sizes, limit)
        return len(self.sizes) - cut, self.weights[-1] - self.weights[cut]


def _limit(limits: _Limits, kind: str) -> int | None:
    """The clipping limit of an entry of `kind` (malformed and other entries: the assistant's)."""
    tool, assistant, user = limits
    return tool if kind == "tool" else user if kind == "user" else assistant


def _entry(item: Item) -> _Entry:
    kind = item.kind
    if kind == "other" and not item.label:  # item.is_malformed, without a property call
        return _Entry("other", "malformed item", clip_middle(item.text, 200))
    if kind == "tool":
        return _Entry("tool", "tool result", item.text)
    if item.observation:
        return _Entry("tool", "command output", item.text)
    if kind == "user":
        return _Entry("user", "user", item.text)
    if kind == "assistant":
        if not item.calls:
            return _Entry("assistant", "assistant", item.text, "")
        calls = "\n".join(f"→ {c.name}({c.arguments})" for c in item.functions)
        return _Entry("assistant", "assistant", item.text, calls)
    return _Entry("other", item.label, item.text)


def _cannot_fit(chars: int, estimator: TokenEstimator, max_tokens: int) -> bool:
    """True when any text of `chars` characters counts more than `max_tokens` (a bound only the
    heuristic estimator gives; the margin covers rounding)."""
    if not isinstance(estimator, HeuristicEstimator):
        return False
    return estimator.least_tokens(chars) > max_tokens + 1


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
        if not _cannot_fit(rendered.shortest(limits), estimator, max_tokens):
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
