"""Preparing a conversation's next checkpoint before a request needs it.

Past `compaction.precompute_ratio`, after a request was forwarded, the next compaction runs in
the background; its checkpoint is held in reserve until the trigger (see Conversations.view).
A conversation for which a check found nothing to do is left quiet until its history grew past
what could change that.
"""

from __future__ import annotations

from cachetools import LRUCache

from compaction.checkpoints import prefix_digests
from proxy.compacting.chat import ChatRequest
from proxy.compacting.conversations import Conversations
from proxy.settings import CompactionSection
from proxy.tasks import BackgroundTasks

# Growth (share of the window) after which a conversation with nothing to fold is checked again.
_RECHECK_GROWTH = 0.02

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

    def would_start(self, chat: ChatRequest, forwarded_tokens: int, raw_tokens: int) -> bool:
        """True when `after_forwarding` would start preparing (it needs the parsed messages)."""
        return forwarded_tokens >= self._threshold(chat) and not self._is_quiet(chat, raw_tokens)

    def after_forwarding(self, chat: ChatRequest, forwarded_tokens: int, raw_tokens: int) -> None:
        """Start preparing the next checkpoint if the forwarded view is past the ratio."""
        if not self.would_start(chat, forwarded_tokens, raw_tokens):
            return
        if self._tasks.closed:  # shutting down: no new background work
            return
        self._tasks.spawn(self._prepare(chat, raw_tokens), name=f"precompute:{chat.session_id}")

    async def _prepare(self, chat: ChatRequest, raw_tokens: int) -> None:
        conversations = self._conversations
        digests = prefix_digests(chat.messages, chat.seed)
        if await conversations.is_running(digests):
            return
        view, tokens, reserve = await conversations.view(chat, digests)
        if reserve is not None:
            # The next checkpoint is ready; nothing to do until the view reaches the trigger.
            self._quiet_for(chat, raw_tokens, self._options.trigger_ratio * chat.window - tokens)
            return
        threshold = self._threshold(chat)
        if tokens < threshold:
            # History only grows: nothing to do until the view grows past the threshold.
            self._quiet_for(chat, raw_tokens, threshold - tokens)
            return
        plan = await conversations.plan(chat, view, target_ratio=self._target_ratio(chat, tokens))
        if await conversations.is_stored(digests, plan, view):
            return
        if conversations.start(chat, view, plan, digests, "precompute") is None:
            # Nothing new to fold yet (the recent rounds are all there is): look again once the
            # conversation grew a little, not on every request.
            self._quiet_for(chat, raw_tokens, _RECHECK_GROWTH * chat.window)

    def _target_ratio(self, chat: ChatRequest, tokens: int) -> float:
        """The target minus the growth still to come before the trigger: applied then, the
        reserve leaves the request near the target rather than already near the trigger."""
        options = self._options
        growth = max(0.0, options.trigger_ratio * chat.window - tokens) / chat.window
        return max(MIN_PRECOMPUTE_TARGET_RATIO, options.target_ratio - growth)

    def _threshold(self, chat: ChatRequest) -> float:
        ratio = self._options.precompute_ratio
        return ratio * chat.window if ratio else float("inf")

    def _is_quiet(self, chat: ChatRequest, raw_tokens: int) -> bool:
        """True while an earlier check of this conversation proved a precompute pointless."""
        quiet = self._quiet.get(_conversation_key(chat))
        return quiet is not None and quiet[0] <= raw_tokens < quiet[1]

    def _quiet_for(self, chat: ChatRequest, raw_tokens: int, growth: float) -> None:
        self._quiet[_conversation_key(chat)] = (raw_tokens, raw_tokens + int(growth))


def _conversation_key(chat: ChatRequest) -> bytes:
    """One conversation of one caller: its seed and the fingerprint of its opening."""
    return chat.seed + chat.opening.encode()
