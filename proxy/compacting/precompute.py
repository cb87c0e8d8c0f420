"""Preparing a conversation's next checkpoint before a request needs it.

Past `compaction.precompute_ratio`, after a request was forwarded, the next compaction runs in
the background; its checkpoint is held in reserve until the trigger (see Conversations.view).
The trigger is whichever rule fires first: `trigger_ratio` of the window, or the prompt plus the
request's `max_tokens` no longer fitting it (a client asking 32k of a 100k window is compacted
at 68k); preparing starts as far before it as `precompute_ratio` is before `trigger_ratio`, so
a client asking a large `max_tokens` is prepared for as early, relative to its trigger.
A conversation for which a check found nothing to do is left quiet until its history grew past
what could change that.

Past the ratio, preparing waits until the conversation is on course to reach its trigger: its
largest growth in its last few requests, `LEAD_REQUESTS` times over, would reach it. A summary
prepared for a conversation that ends before its trigger is paid for nothing (at 8k, a tenth of
such a conversation's cost); one prepared `LEAD_REQUESTS` requests ahead still has the agent's
turns in between to finish in, so no request waits on it. A conversation seen for the first time
past the ratio has no growth yet: it is prepared for, as before.
"""

from __future__ import annotations

import math

from cachetools import LRUCache

from compaction import View, plan_key
from proxy.compacting.conversations import Conversations
from proxy.compacting.history import ListHistory
from proxy.compacting.request import ParsedRequest
from proxy.settings import CompactionSection
from proxy.tasks import BackgroundTasks

# Growth (share of the window) after which a conversation with nothing to fold is checked again.
_RECHECK_GROWTH = 0.02

LEAD_REQUESTS = 2
"""How many requests ahead of its trigger, at its recent growth, a conversation is prepared for."""

_STEPS_KEPT = 3
"""The growth steps remembered per conversation: the largest of them is its growth."""

MIN_PRECOMPUTE_TARGET_RATIO = 0.35
"""However early a reserve is prepared, it never folds the request below this share."""


class Precompute:
    def __init__(
        self, options: CompactionSection, conversations: Conversations, tasks: BackgroundTasks
    ) -> None:
        self._options = options
        self._conversations = conversations
        self._tasks = tasks
        # Per conversation: a raw-estimate range [from, to) in which a precompute has been shown
        # to find nothing to do (a shorter, edited or other conversation falls outside it).
        self._quiet: LRUCache[bytes, tuple[int, int]] = LRUCache(options.checkpoint_max_entries)
        # Per conversation: the raw estimate of its latest request and its last growth steps.
        self._growth: LRUCache[bytes, tuple[int, tuple[int, ...]]] = LRUCache(
            options.checkpoint_max_entries
        )

    def would_start(self, request: ParsedRequest, forwarded_tokens: int, raw_tokens: int) -> bool:
        """True when `after_forwarding` would start preparing (it needs the parsed messages)."""
        growth = self._grown(request, raw_tokens)
        if forwarded_tokens < self._threshold(request) or self._is_quiet(request, raw_tokens):
            return False
        return growth is None or forwarded_tokens + LEAD_REQUESTS * growth >= trigger(
            self._options, request
        )

    def _grown(self, request: ParsedRequest, raw_tokens: int) -> int | None:
        """The conversation's growth per request (the largest of its last steps), its latest
        estimate noted (once per request: asked again for the same estimate, nothing moves);
        None while it has no step yet."""
        key = _conversation_key(request)
        last = self._growth.get(key)
        if last is None or raw_tokens < last[0]:  # new here, or not a continuation
            self._growth[key] = (raw_tokens, ())
            return None
        latest, steps = last
        if raw_tokens > latest:
            steps = (*steps, raw_tokens - latest)[-_STEPS_KEPT:]
            self._growth[key] = (raw_tokens, steps)
        return max(steps) if steps else None

    def after_forwarding(
        self, request: ParsedRequest, forwarded_tokens: int, raw_tokens: int
    ) -> None:
        """Start preparing the next checkpoint if the forwarded view is past the ratio."""
        if not self.would_start(request, forwarded_tokens, raw_tokens):
            return
        if self._tasks.closed:  # shutting down: no new background work
            return
        self._tasks.spawn(
            self._prepare(request, raw_tokens), name=f"precompute-start:{request.session_id}"
        )

    async def _prepare(self, request: ParsedRequest, raw_tokens: int) -> None:
        """Register the planning under the request's last digest before anything is awaited:
        until planned, what it will fold (its checkpoint key) is unknown, and a plan can take a
        second (a worker pool starting on first use); a request at the trigger meanwhile finds
        it there and waits rather than summarize this growth step on its own."""
        history = ListHistory.of(request)
        digests = history.prefix_digests()
        planning = self._conversations.planning
        if planning.find(reversed(digests)) is None:  # none for this or an earlier request
            planning.start(
                digests[-1],
                lambda: self._plan(request, raw_tokens, history),
                name=f"precompute:{request.session_id}",
            )

    async def _plan(self, request: ParsedRequest, raw_tokens: int, history: ListHistory) -> None:
        conversations = self._conversations
        digests = history.prefix_digests()
        if await conversations.is_running(digests):
            return
        base, tokens, reserve = await conversations.view(request, history)
        if reserve is not None:
            # The next checkpoint is ready; nothing to do until the view reaches the trigger.
            self._quiet_for(request, raw_tokens, trigger(self._options, request) - tokens)
            return
        threshold = self._threshold(request)
        if tokens < threshold:
            # History only grows: nothing to do until the view grows past the threshold.
            self._quiet_for(request, raw_tokens, threshold - tokens)
            return
        ratio = self._target_ratio(request, tokens)
        view = View.of(request.messages, base)
        compaction = await conversations.plan(request, view, target_ratio=ratio)
        key = plan_key(view, compaction.plan, digests)
        if key is not None and await conversations.stored(digests, key) is not None:
            return  # prepared already
        if conversations.start(request, view, compaction, digests, "precompute") is None:
            # Nothing new to fold yet (the recent rounds are all there is): look again once the
            # conversation grew a little, not on every request.
            self._quiet_for(request, raw_tokens, _RECHECK_GROWTH * request.window)

    def _target_ratio(self, request: ParsedRequest, tokens: int) -> float:
        """The target minus the growth still to come before the trigger: applied then, the
        reserve leaves the request near the target rather than already near the trigger."""
        options = self._options
        growth = max(0.0, trigger(options, request) - tokens) / request.window
        return max(MIN_PRECOMPUTE_TARGET_RATIO, options.target_ratio - growth)

    def _threshold(self, request: ParsedRequest) -> float:
        """Where preparing starts: `precompute_ratio` of the window, or as far before the
        `max_tokens` rule's trigger as that is before `trigger_ratio`, whichever comes first."""
        options = self._options
        ratio = options.precompute_ratio
        if not ratio:
            return float("inf")
        lead = (options.trigger_ratio - ratio) * request.window
        return max(0.0, min(ratio * request.window, trigger(options, request) - lead))

    def _is_quiet(self, request: ParsedRequest, raw_tokens: int) -> bool:
        """True while an earlier check of this conversation proved a precompute pointless."""
        quiet = self._quiet.get(_conversation_key(request))
        return quiet is not None and quiet[0] <= raw_tokens < quiet[1]

    def _quiet_for(self, request: ParsedRequest, raw_tokens: int, growth: float) -> None:
        self._quiet[_conversation_key(request)] = (raw_tokens, raw_tokens + int(growth))


def trigger(options: CompactionSection, request: ParsedRequest) -> int:
    """The smallest estimate at which `request` is compacted (compaction.should_compact): at
    `trigger_ratio` of its window, or sooner when the prompt plus its `max_tokens` would not
    fit the window."""
    at_ratio = math.ceil(options.trigger_ratio * request.window)
    if request.max_output_tokens is None:
        return at_ratio
    return min(at_ratio, request.window - request.max_output_tokens + 1)


def _conversation_key(request: ParsedRequest) -> bytes:
    """One conversation of one caller: its seed and the fingerprint of its opening."""
    return request.seed + request.opening.encode()
