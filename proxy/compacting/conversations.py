"""The compactions of every conversation: remembered, running, and prepared ahead.

Checkpoints are looked up by prefix digest and substituted; a conversation still over the trigger
is compacted further once, however many requests wait (single-flight); past the precompute ratio
the next checkpoint is prepared in the background and held in reserve until the trigger. Each
compaction is recorded (proxy.compacting.records). The HTTP-facing decisions (parsing,
headers, retries) live in proxy.compacting.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
from cachetools import LRUCache

from compaction import CompactionResult, Compactor, Plan
from compaction.checkpoints import (
    Checkpoint,
    CheckpointStore,
    View,
    checkpoint_after,
    find_longest,
    prefix_digests,
)
from proxy.compacting.chat import ChatRequest
from proxy.compacting.cooldown import Cooldown
from proxy.compacting.flight import SingleFlight, wait_shielded
from proxy.compacting.llm_client import ModelParameters, UpstreamLLM
from proxy.compacting.records import record_compaction
from proxy.http.sessions import SessionRecords
from proxy.metrics import CompactionMetrics
from proxy.settings import CompactionSettings
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """What to forward for one request, and what the response headers say about it."""

    messages: list[Any]
    status: str
    tokens_before: int
    tokens_after: int
    compaction_id: str | None


class Compactions:
    def __init__(
        self,
        options: CompactionSettings,
        *,
        upstream_url: str,
        client: Callable[[], aiohttp.ClientSession],
        compactor: Compactor,
        store: CheckpointStore,
        records: SessionRecords,
        metrics: CompactionMetrics,
        tasks: BackgroundTasks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._upstream_url = upstream_url
        self._client = client
        self._compactor = compactor
        self._store = store
        self._records = records
        self._metrics = metrics
        self._tasks = tasks
        self._clock = clock
        self._flight: SingleFlight[bytes, CompactionResult] = SingleFlight(tasks)
        self._cooldown = Cooldown(options.failure_threshold, options.failure_cooldown_s, clock)
        self._parameters = ModelParameters()
        # Per conversation: a raw-estimate range [from, to) in which a precompute has been shown
        # to find nothing to do (a shorter, edited or other conversation falls outside it).
        self._quiet: LRUCache[bytes, tuple[int, int]] = LRUCache(options.checkpoint_max_entries)

    def estimate(self, chat: ChatRequest, messages: list[Any]) -> int:
        return self._compactor.estimate(messages, chat.tools, estimator=chat.estimator)

    def needs(self, chat: ChatRequest, tokens: int) -> bool:
        return self._compactor.needs_compaction(tokens, chat.window, chat.max_output_tokens)

    def prepare_next(self, chat: ChatRequest, forwarded_tokens: int, raw_tokens: int) -> None:
        """After forwarding: start preparing the next checkpoint if the view is past the ratio."""
        if forwarded_tokens >= self._precompute_at(chat) and not self._is_quiet(chat, raw_tokens):
            self._spawn(self._precompute(chat, raw_tokens), name=f"precompute:{chat.session_id}")

    async def compact(
        self, chat: ChatRequest, before: int, *, reason: str, force: bool = False
    ) -> Decision:
        deadline = self._clock() + self._options.summary_timeout_s
        digests = prefix_digests(chat.messages, chat.seed)
        view, tokens, reserve = self._view(chat, digests)
        if force and reserve is not None:
            view = View.of(chat.messages, reserve)
            tokens = self.estimate(chat, view.messages)
        if view.base is not None and not force and not self.needs(chat, tokens):
            self._metrics.checkpoint_hits.inc()
            return Decision(view.messages, "reused", before, tokens, view.base.compaction_id)
        pending = self._flight.find(reversed(digests))
        if pending is not None and not force:
            # A compaction of this conversation is under way (a precompute, or a concurrent
            # request): wait for it rather than summarize the same history again.
            # Timed out, or it failed (and logged): go on with our own plan.
            with contextlib.suppress(Exception):
                await wait_shielded(pending, max(0.0, deadline - self._clock()))
            view, tokens, _ = self._view(chat, digests)
            if view.base is not None and not self.needs(chat, tokens):
                self._metrics.checkpoint_hits.inc()
                return Decision(view.messages, "reused", before, tokens, view.base.compaction_id)
        plan = self._compactor.plan(
            view.messages,
            window=chat.window,
            tools=chat.tools,
            max_output_tokens=chat.max_output_tokens,
            estimator=chat.estimator,
        )
        key = self._key(view, plan, digests)
        if key is None:
            status = "reused" if view.base is not None else "failed"
            return Decision(view.messages, status, before, tokens, None)
        task = self._flight.start(
            key,
            lambda: self._summarize(chat, view, plan, digests, reason),
            name=f"compact:{chat.session_id}",
        )
        try:
            result = await wait_shielded(task, max(0.0, deadline - self._clock()))
        except Exception as exc:
            # Timed out: the summarization goes on and records its checkpoint for the next
            # request. Failed: it was logged where it ran. Either way this request goes out now
            # on the fallback path, which flushes memory too: the summarization may yet come
            # back unchanged, and what this request folded must reach the memory file (the
            # writer skips items already there).
            if isinstance(exc, TimeoutError):
                self._metrics.summary_timeouts.inc()
            result = await self._compactor.run(
                view.messages,
                plan,
                llm=None,
                session_id=chat.session_id,
                tools=chat.tools,
                estimator=chat.estimator,
            )
        if result.path == "unchanged":
            return Decision(view.messages, "failed", before, tokens, None)
        return Decision(
            result.messages, "applied", before, result.tokens_after, result.compaction_id
        )

    def _view(self, chat: ChatRequest, digests: list[bytes]) -> tuple[View, int, Checkpoint | None]:
        """The view to forward, its tokens, and a precomputed checkpoint still held in reserve.

        A checkpoint prepared ahead of the trigger is used only once the view it extends (its
        parent's, or the original) reaches the trigger: applied earlier, it would move every
        compaction after the first down to the precompute ratio.
        """
        newest = find_longest(self._store, digests)
        view = View.of(chat.messages, newest)
        if newest is None or not newest.precomputed:
            return view, self.estimate(chat, view.messages), None
        parent = self._store.get(newest.parent) if newest.parent is not None else None
        parent_view = View.of(chat.messages, parent)
        parent_tokens = self.estimate(chat, parent_view.messages)
        if self.needs(chat, parent_tokens):
            return view, self.estimate(chat, view.messages), None
        return parent_view, parent_tokens, newest

    @staticmethod
    def _key(view: View, plan: Plan, digests: list[bytes]) -> bytes | None:
        """The checkpoint key the plan would produce; None when it folds nothing new."""
        if plan.keep_from <= plan.head_end or not plan.folded:
            return None
        if view.base is not None and plan.keep_from < view.base.prefix_len:
            return None
        cut = view.original_index(plan.keep_from)
        if cut is None or not 0 < cut <= len(digests):
            return None
        return digests[cut - 1]

    def _precompute_at(self, chat: ChatRequest) -> float:
        ratio = self._options.precompute_ratio
        return ratio * chat.window if ratio else float("inf")

    def _is_quiet(self, chat: ChatRequest, raw_tokens: int) -> bool:
        """True while an earlier check of this conversation proved a precompute pointless."""
        quiet = self._quiet.get(_conversation_key(chat))
        return quiet is not None and quiet[0] <= raw_tokens < quiet[1]

    def _spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        if self._tasks.closed:  # shutting down: no new background work
            coro.close()
            return
        self._tasks.spawn(coro, name=name)

    async def _precompute(self, chat: ChatRequest, raw_tokens: int) -> None:
        """Prepare the conversation's next checkpoint before a request needs it."""
        digests = prefix_digests(chat.messages, chat.seed)
        if self._flight.find(digests) is not None:
            return
        view, tokens, reserve = self._view(chat, digests)
        if reserve is not None:
            # The next checkpoint is ready; nothing to do until the view reaches the trigger.
            self._quiet[_conversation_key(chat)] = (
                raw_tokens,
                raw_tokens + int(self._options.trigger_ratio * chat.window - tokens),
            )
            return
        threshold = self._precompute_at(chat)
        if tokens < threshold:
            # History only grows: nothing to do until the view grows past the threshold.
            self._quiet[_conversation_key(chat)] = (
                raw_tokens,
                raw_tokens + int(threshold - tokens),
            )
            return
        plan = self._compactor.plan(
            view.messages,
            window=chat.window,
            tools=chat.tools,
            max_output_tokens=chat.max_output_tokens,
            estimator=chat.estimator,
        )
        key = self._key(view, plan, digests)
        if key is None or self._store.get(key) is not None:
            return
        self._flight.start(
            key,
            lambda: self._summarize(chat, view, plan, digests, "precompute"),
            name=f"precompute-run:{chat.session_id}",
        )

    async def _summarize(
        self, chat: ChatRequest, view: View, plan: Plan, digests: list[bytes], reason: str
    ) -> CompactionResult:
        summary_model = self._options.summary_model or chat.model
        # One tenant's failing key must not cool the summarizer down for everyone.
        cooldown_key = f"{summary_model}\x00{chat.tenant.hex()}"
        llm: UpstreamLLM | None = None
        if self._cooldown.is_cooling(cooldown_key):
            self._metrics.cooldown_skips.inc()
        else:
            llm = UpstreamLLM(
                self._client(),
                self._upstream_url,
                model=summary_model,
                credential=chat.credential,
                client_headers=chat.auth_headers,
                timeout_s=self._compactor.settings.llm_timeout_s,
                parameters=self._parameters,
            )
        result = await self._compactor.run(
            view.messages,
            plan,
            llm=llm,
            session_id=chat.session_id,
            tools=chat.tools,
            estimator=chat.estimator,
        )
        if llm is not None and result.path != "unchanged":
            # "unchanged" says nothing about the summarizer (nothing to fold, or no gain).
            ok = result.path == "llm"
            self._cooldown.record(cooldown_key, ok=ok)
            self._metrics.summarizer_seconds.observe(result.duration_s)
            if not ok:
                self._metrics.summarizer_failures.inc()
        checkpoint = checkpoint_after(view, result, digests, precomputed=reason == "precompute")
        if checkpoint is not None:
            self._store.put(checkpoint)
        record_compaction(
            self._records, self._metrics, chat, view, result, reason=reason, checkpoint=checkpoint
        )
        return result


def _conversation_key(chat: ChatRequest) -> bytes:
    """One conversation of one caller: its seed and the fingerprint of its opening."""
    return chat.seed + chat.opening.encode()
