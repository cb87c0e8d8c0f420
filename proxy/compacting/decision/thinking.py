"""Thinking bound to its prefix: which thinking blocks a compacted request may send back.

Anthropic's newer models (Claude Fable 5.1 and later, Mythos 5.x, Opus/Sonnet/Haiku 5.5: platform
docs `build-with-claude/preserved-thinking`) check every thinking block a request sends back: it
is valid only while `system`, `tools` and everything before it are what they were when the model
wrote it; an edited prefix is a 400 ("bound to a different conversation"), or silently dropped
reasoning. A compaction edits the prefix of every turn it keeps, so on those models
(`models.preserved_thinking`, or a model learned from that 400) a compacted request removes the
thinking of each kept turn the client had before the compaction first went out (removing
thinking is allowed: the docs' own advice for a history that is summarized,
`.../preserved-thinking/prefix-checks`). What the model writes while the compaction is reused
was written on that same compacted prefix, byte-stable request after request (the summary, the
pinned turns, the tools with `recall`, the same turns stripped): it stays, and stays valid.

The models learned from that 400 are kept in the state (`BoundModels`: the state file, or
Redis shared by the replicas) and read back at most every REFRESH_S, so a restarted process or
another replica strips their thinking before it is refused: at most one refused request per
model and process, whichever process learned it.

Where "before" ends is the number of messages of the first request this process forwarded with
the compaction (`fresh_from`): the turns from there on were answered on the compacted prefix.
It is kept in the process (a bounded table). A restarted process, or another replica, starts
its count at its own first request: it strips a few more turns than needed (allowed, never
refused), and a model that still refuses is retried once without any thinking in kept turns
(`CompactedExchange`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from cachetools import LRUCache

from compaction import Message
from proxy.compacting.decision.request import Decision, ParsedRequest
from proxy.dialects import Dialect
from proxy.settings import ModelsSettings
from proxy.state.roles import BoundModels

REFRESH_S = 10.0
"""How often the bound models learned elsewhere are read back from the state, at most."""


class BoundThinking:
    def __init__(
        self,
        models: ModelsSettings,
        max_entries: int,
        *,
        bound: BoundModels | None = None,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`bound`: where the models learned from a refusal are kept beyond the process (None:
        in the process only)."""
        self._models = models
        self._fresh_from: LRUCache[str, int] = LRUCache(max_entries)
        self._learned: LRUCache[str, None] = LRUCache(models.max_models)
        self._bound = bound
        self._refresh_s = refresh_s
        self._clock = clock
        self._read_at: float | None = None

    async def refresh(self) -> None:
        """Take the models learned by another process, or by this one before a restart, from
        the state: the first time, then at most every `refresh_s`."""
        if self._bound is None:
            return
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._refresh_s:
            return
        self._read_at = now
        for model in await self._bound.bound_models():
            self._learned[model] = None

    def applies(self, dialect: Dialect, model: str) -> bool:
        """True when `model`'s thinking blocks are bound to their prefix (configured, or
        learned from a refusal) and its API has thinking blocks."""
        if not dialect.has_thinking:
            return False
        return model in self._learned or self._models.has_preserved_thinking(model)

    async def learn(self, model: str, compaction_id: str | None, count: int) -> None:
        """`model` refused a compacted request of `count` messages going out with
        `compaction_id` for a thinking block's prefix: from now on its compacted requests carry
        none whose prefix changed, in this process and (through the state) in others, and
        that compaction's fresh turns start after these."""
        self._learned[model] = None
        if compaction_id is not None:
            self._fresh_from[compaction_id] = count
        if self._bound is not None:
            await self._bound.add_bound_model(model)

    def forwarded(self, req: ParsedRequest, decision: Decision) -> Decision:
        """`decision` on `req` as it may go upstream (see `view`); its estimate less what was
        removed, so calibration learns from what really went out."""
        view = decision.messages
        messages = self.view(req, view, decision.compaction_id)
        if messages is view:
            return decision
        removed = sum(req.estimator.count_messages(view)) - sum(
            req.estimator.count_messages(messages)
        )
        return replace(decision, messages=messages, tokens_after=decision.tokens_after - removed)

    def view(
        self, req: ParsedRequest, view: list[Message], compaction_id: str | None
    ) -> list[Message]:
        """`view`, a compaction's view of `req` (None: the request as sent), without the
        thinking whose prefix the compaction changed, on a model that binds it (else `view`
        itself)."""
        if compaction_id is None or not self.applies(req.dialect, req.model):
            return view
        native = req.dialect.native
        if native is not None and native.has_native(view):
            # The provider's own compaction block leads: the kept turns' thinking stays valid
            # (proxy.dialects.anthropic.native).
            return view
        fresh_from = self.fresh_from(compaction_id, len(req.messages))
        return self.strip(req.dialect, req.messages, view, fresh_from)

    def fresh_from(self, compaction_id: str, count: int) -> int:
        """The index of the first message answered on `compaction_id`'s prefix: `count` (the
        messages of the request going out now) the first time this process sees it."""
        found = self._fresh_from.get(compaction_id)
        if found is None:
            self._fresh_from[compaction_id] = found = count
        return found

    def strip(
        self,
        dialect: Dialect,
        original: Sequence[Message],
        view: list[Message],
        fresh_from: int,
    ) -> list[Message]:
        """`view` (kept messages are `original`'s own objects) with the thinking removed from
        every kept message of `original` before `fresh_from`; a message left with no content
        goes (consecutive user turns are one turn to the API). The same list when nothing
        changes."""
        stale = {id(message) for message in original[:fresh_from]}
        out: list[Message] = []
        changed = False
        for message in view:
            if id(message) in stale:
                stripped = dialect.without_thinking(message)
                if stripped is not None:
                    changed = True
                    if not stripped.get("content"):
                        continue
                    message = stripped
            out.append(message)
        return out if changed else view
