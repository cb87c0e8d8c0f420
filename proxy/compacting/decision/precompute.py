"""Preparing a conversation's next checkpoint before a request needs it.

Past `compaction.precompute_ratio`, after a request was forwarded, the next compaction runs in
the background; its checkpoint is held in reserve until the trigger (see Conversations.view).
The trigger is whichever rule fires first (compaction.Trigger): `trigger_ratio` of the window,
`trigger_tokens`, or the prompt plus the request's `max_tokens` no longer fitting it (a client
asking 32k of a 100k window is compacted at 68k); preparing starts as far before it as
`precompute_ratio` is before `trigger_ratio`, so a client asking a large `max_tokens` is
prepared for as early, relative to its trigger. The ratios are shares of the trigger's
effective window: with `trigger_tokens` 200k on a 1M window, preparing starts at 0.7 of 235k.
A conversation for which a check found nothing to do is left quiet until its history grew past
what could change that.

Two moments: the trigger is where a compaction starts, the fit limit
(proxy.compacting.decision.conversations.fit_limit: `fit_ratio` of the window, `max_tokens`
within it) where it must apply. A request past the trigger that still fits goes out as it is and starts
its conversation's compaction here; the compaction applies on the first request after it is
ready, and only a request that would no longer fit waits for it.

Before the trigger, past the ratio, preparing waits for the last request that leaves it time:
the one after which, at the conversation's largest growth of its last few requests, the next
would no longer fit (`LEAD_REQUESTS`), or earlier when the next request, at the quickest pace
of its last few, would leave less than `SUMMARY_MARGIN` times what a compaction prepared ahead
takes. A summary prepared for a conversation that ends before its trigger is paid for nothing;
with room between the trigger and the fit limit, most conversations start theirs at the
trigger, and one that ends short of it pays none. What a compaction takes is learned from those
that ran (the slowest recent one; until the first, a third of `summary_timeout_s`). A
conversation seen for the first time past the ratio has no pace yet: it is prepared for.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import NamedTuple

from cachetools import LRUCache

from compaction import CompactionResult, View, plan_key
from proxy.compacting.decision.conversations import Conversations, fit_limit
from proxy.compacting.decision.history import ListHistory
from proxy.compacting.decision.request import ParsedRequest
from proxy.settings import CompactionSection
from proxy.tasks import BackgroundTasks

# Growth (share of the window) after which a conversation with nothing to fold is checked again.
_RECHECK_GROWTH = 0.02

LEAD_REQUESTS = 1
"""How many requests ahead of its trigger, at its recent growth, a conversation is prepared for
however quick its summaries: the summary runs while the upstream answers the request, and the
client takes its turn."""

SUMMARY_MARGIN = 1.25
"""The least time, in times what a compaction takes, a summary prepared ahead is given before
the trigger, at the conversation's pace. The compaction's time is already the slowest recent
one, the pace the quickest, the growth the largest: the margin covers what varies beyond them."""

_STEPS_KEPT = 3
"""The steps remembered per conversation: its largest growth and quickest pace count."""

_SUMMARY_DECAY = 0.9
"""What a compaction takes is its longest recent duration, decaying by this much each time."""


class _Step(NamedTuple):
    tokens: int
    seconds: float


class _Course(NamedTuple):
    """A conversation's latest estimate, when it came, and its last steps to it."""

    tokens: int
    at: float
    steps: tuple[_Step, ...]


MIN_PRECOMPUTE_TARGET_RATIO = 0.25
"""However early a reserve is prepared, it never folds the request below this share."""


class Precompute:
    def __init__(
        self,
        options: CompactionSection,
        conversations: Conversations,
        tasks: BackgroundTasks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._clock = clock
        self._summary_s = options.summary_timeout_s / 3
        self._summary_seen = False
        self._conversations = conversations
        self._tasks = tasks
        # Per conversation: a raw-estimate range [from, to) in which a precompute has been shown
        # to find nothing to do (a shorter, edited or other conversation falls outside it).
        self._quiet: LRUCache[bytes, tuple[int, int]] = LRUCache(options.checkpoint_max_entries)
        # Per conversation: its latest estimate and its last steps (proxy-wide: LRU-bounded).
        self._courses: LRUCache[bytes, _Course] = LRUCache(options.checkpoint_max_entries)

    def would_start(self, request: ParsedRequest, forwarded_tokens: int, raw_tokens: int) -> bool:
        """True when `after_forwarding` would start preparing (it needs the parsed messages)."""
        steps = self._follow(request, raw_tokens)
        if forwarded_tokens < self._threshold(request) or self._is_quiet(request, raw_tokens):
            return False
        if not steps or forwarded_tokens >= trigger(self._options, request):
            return True  # the trigger is where a compaction starts
        growth = max(step.tokens for step in steps)
        pace = min(step.seconds for step in steps)
        # Requests until one would no longer fit: the last moment a compaction can apply.
        last = max(trigger(self._options, request) - 1, fit_limit(self._options, request))
        left = math.ceil((last + 1 - forwarded_tokens) / growth)
        if left <= LEAD_REQUESTS:
            return True
        # Waiting for the next request leaves its summary (left - 1) requests' time.
        return (left - 1) * pace < SUMMARY_MARGIN * self._summary_s

    def _follow(self, request: ParsedRequest, raw_tokens: int) -> tuple[_Step, ...]:
        """The conversation's last steps, its latest estimate noted (once per request: asked
        again for the same estimate, nothing moves)."""
        key, now = _conversation_key(request), self._clock()
        course = self._courses.get(key)
        if course is None or raw_tokens < course.tokens:  # new here, or not a continuation
            self._courses[key] = _Course(raw_tokens, now, ())
            return ()
        if raw_tokens > course.tokens:
            step = _Step(raw_tokens - course.tokens, now - course.at)
            course = _Course(raw_tokens, now, (*course.steps, step)[-_STEPS_KEPT:])
            self._courses[key] = course
        return course.steps

    def _learn(self, task: asyncio.Task[object]) -> None:
        """What a compaction prepared ahead took, if it asked a model."""
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if not isinstance(result, CompactionResult) or result.path != "llm":
            return
        decayed = self._summary_s * _SUMMARY_DECAY if self._summary_seen else 0.0
        self._summary_s = max(result.duration_s, decayed)
        self._summary_seen = True

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
        task = conversations.start(request, view, compaction, digests, "precompute")
        if task is None:
            # Nothing new to fold yet (the recent rounds are all there is): look again once the
            # conversation grew a little, not on every request.
            self._quiet_for(request, raw_tokens, _RECHECK_GROWTH * _shares(self._options, request))
        else:
            task.add_done_callback(self._learn)

    def _target_ratio(self, request: ParsedRequest, tokens: int) -> float:
        """The target minus the growth still to come before the compaction applies: up to the
        trigger (a reserve is held until then), and while its summary runs (one started at the
        trigger applies on the first request after it is ready). Applied then, it leaves the
        request near the target rather than already on its way back to the trigger."""
        options = self._options
        to_trigger = max(0.0, trigger(options, request) - tokens)
        course = self._courses.get(_conversation_key(request))
        while_running = 0.0
        if course is not None and course.steps:
            growth = max(step.tokens for step in course.steps)
            pace = max(1e-3, min(step.seconds for step in course.steps))
            while_running = growth * math.ceil(self._summary_s / pace)
        ahead = max(to_trigger, while_running) / _shares(options, request)
        return max(MIN_PRECOMPUTE_TARGET_RATIO, options.target_ratio - ahead)

    def _threshold(self, request: ParsedRequest) -> float:
        """Where preparing starts: `precompute_ratio` of the window, or as far before the
        `max_tokens` rule's trigger as that is before `trigger_ratio`, whichever comes first."""
        options = self._options
        ratio = options.precompute_ratio
        if not ratio:
            # Nothing prepared before the trigger. Past it, a request that still fits goes out as
            # it is and its compaction starts here; without that room (`fit_ratio` None) the
            # request at the trigger compacts itself and nothing is started.
            return float("inf") if options.fit_ratio is None else trigger(options, request)
        shares = _shares(options, request)
        lead = (options.trigger_ratio - ratio) * shares
        return max(0.0, min(ratio * shares, trigger(options, request) - lead))

    def _is_quiet(self, request: ParsedRequest, raw_tokens: int) -> bool:
        """True while an earlier check of this conversation proved a precompute pointless."""
        quiet = self._quiet.get(_conversation_key(request))
        return quiet is not None and quiet[0] <= raw_tokens < quiet[1]

    def _quiet_for(self, request: ParsedRequest, raw_tokens: int, growth: float) -> None:
        self._quiet[_conversation_key(request)] = (raw_tokens, raw_tokens + int(growth))


def trigger(options: CompactionSection, request: ParsedRequest) -> int:
    """The smallest estimate at which `request` is compacted (compaction.Trigger)."""
    return options.trigger.at(request.window, request.max_output_tokens)


def _shares(options: CompactionSection, request: ParsedRequest) -> int:
    """The window the precompute and target ratios are shares of (Trigger.effective_window)."""
    return options.trigger.effective_window(request.window)


def _conversation_key(request: ParsedRequest) -> bytes:
    """One conversation of one caller: its seed and the fingerprint of its opening."""
    return request.seed + request.opening.encode()
