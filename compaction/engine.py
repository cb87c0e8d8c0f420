"""The seed API for in-process agents (docs/library.md): compact a history, flush memory, verify.

Built on `Compactor`; it adds what an agent without the proxy needs: a window chosen from the
number of rounds to keep, a memory directory, and a verification of a compacted history. The
task card's shape holds: the compacted history is the summary message and the last `keep_recent`
rounds, nothing between them (the task and the user's standing instructions travel inside the
summary).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from compaction.compactor import Compactor
from compaction.extract import extract_items_heuristically
from compaction.ledger import build_ledger, is_overflow_item
from compaction.memory import MemoryWriter
from compaction.mentions import MentionCache
from compaction.messages import is_summary_message, read_items
from compaction.plan import Trigger
from compaction.segment import split
from compaction.settings import KEEP_RECENT_ROUNDS, CompactionSettings
from compaction.summarize import summary_text
from compaction.tokens import REPLY_PRIMING_TOKENS, HeuristicEstimator
from compaction.types import ChatLLM, Plan, TokenEstimator, Verification
from compaction.verify import check_preserved


class CompactionEngine:
    """The task card's API for in-process agents: compact a history, flush memory, verify.

    Without `window`, `compact` plans against a window chosen so that exactly `keep_recent`
    rounds are kept: (head + the last `keep_recent` rounds + the summary budget) / target_ratio.
    With `llm=None` every compaction takes the extractive path. The memory file is
    `{memory_dir}/{session_id}/compaction_flush.jsonl`, `user/` by default as on the task card.
    """

    def __init__(
        self,
        llm: ChatLLM | None,
        memory_dir: str | os.PathLike[str],
        *,
        session_id: str = "user",
        window: int | None = None,
        settings: CompactionSettings | None = None,
        estimator: TokenEstimator | None = None,
    ) -> None:
        self.llm = llm
        self.session_id = session_id
        self.window = window
        self.settings = settings or CompactionSettings()
        self.estimator: TokenEstimator = estimator or HeuristicEstimator()
        self.memory = MemoryWriter(memory_dir)
        self.mentions = MentionCache()
        """Shared by the compactions of this engine: a later one scans only new texts."""
        self.memory.path_for(session_id)  # an invalid session id fails here, not mid-compaction

    async def should_compact(self, current_tokens: int, budget: int) -> bool:
        trigger = Trigger(self.settings.trigger_ratio, self.settings.trigger_tokens)
        return trigger.is_reached(current_tokens, budget)

    async def compact(
        self, conversation_history: list[Any], keep_recent: int = KEEP_RECENT_ROUNDS
    ) -> dict[str, Any]:
        compactor = Compactor(
            settings=replace(self.settings, keep_recent_rounds=keep_recent),
            estimator=self.estimator,
            mentions=self.mentions,
        )
        window = self.window or self._window_keeping(conversation_history, keep_recent)
        if window is None:
            result = None
        else:
            compaction = await compactor.prepare(conversation_history, window=window)
            compaction.plan = quote_pinned(compaction.plan)
            result = await compaction.run(llm=self.llm, session_id=None)
        if result is None or result.path == "unchanged":
            tokens = compactor.estimate(conversation_history)
            return {
                "compacted_history": list(conversation_history),
                "summary": "",
                "flushed_to_memory": [],
                "original_tokens": tokens,
                "compacted_tokens": tokens,
                "compression_ratio": 1.0,
                "key_decisions_preserved": 0,
                "key_decisions_total": 0,
                "path": "unchanged",
                "reason": result.reason if result else f"{keep_recent} rounds or fewer",
            }
        flushed = await self.memory.write(
            self.session_id, result.compaction_id, result.memory_items
        )
        verification = result.verification or Verification("good", (), 0, 0)
        return {
            "compacted_history": result.messages,
            "summary": result.summary_text,
            "flushed_to_memory": flushed,
            "original_tokens": result.tokens_before,
            "compacted_tokens": result.tokens_after,
            "compression_ratio": result.compression_ratio,
            "key_decisions_preserved": verification.key_decisions_preserved,
            "key_decisions_total": verification.key_decisions_total,
            "path": result.path,
            "reason": result.reason,
        }

    def _window_keeping(self, history: Sequence[Any], keep_recent: int) -> int | None:
        """A window whose plan keeps exactly the last `keep_recent` rounds; None if there are
        not more rounds than that."""
        segments = split(history, self.estimator)
        rounds = [r for r in segments.rounds if r.has_user]
        if len(rounds) <= keep_recent:
            return None
        kept = sum(r.tokens for r in rounds[len(rounds) - keep_recent :]) if keep_recent > 0 else 0
        kept += rounds[0].blocks[0].tokens  # the task (first request), quoted by the summary
        needed = (
            segments.head_tokens + REPLY_PRIMING_TOKENS + kept + self.settings.summary_max_tokens
        )
        return math.ceil(needed / self.settings.target_ratio) + 1

    async def verify_compaction(self, original: list[Any], compacted: Any) -> dict[str, Any]:
        """How much of what the folded messages held the summary keeps.

        `compacted` is a compact() result or the compacted message list. The keys are the items
        flushed to memory (if known), items found by keyword, and the ledger's requests and tool
        trail of the messages that no longer appear; a key is preserved when the summary or the
        memory lines flushed with the result hold it.
        """
        if isinstance(compacted, dict):
            history = compacted.get("compacted_history") or []
            flushed = compacted.get("flushed_to_memory") or []
        else:
            history, flushed = compacted, []
        summary = next((summary_text(m) for m in history if is_summary_message(m)), "")
        kept_ids = {id(m) for m in history}
        folded = [
            i
            for i, m in enumerate(original)
            if id(m) not in kept_ids and m not in history and not is_summary_message(m)
        ]
        keys = [
            r["content"]
            for r in flushed
            if isinstance(r, dict)
            and isinstance(r.get("content"), str)
            and not is_overflow_item(r["content"])
        ]
        items = read_items(original)
        keys += [i.content for i in extract_items_heuristically(items[i] for i in folded)]
        keys += build_ledger(items, folded).requests_and_trail()
        # What had no room in the summary went to the memory file: still kept, not missing.
        memory = [r["content"] for r in flushed if isinstance(r, dict) and "content" in r]
        verification = check_preserved(keys, "\n".join([summary, *map(str, memory)]))
        return {
            "quality": verification.quality,
            "missing_key_info": list(verification.missing_key_info),
            "key_decisions_preserved": verification.key_decisions_preserved,
            "key_decisions_total": verification.key_decisions_total,
        }


def quote_pinned(plan: Plan) -> Plan:
    """`plan` with nothing pinned between the summary and the kept rounds: what it would pin
    (the task, a cut round's request) the summary quotes instead."""
    if not plan.pinned:
        return plan
    return replace(plan, pinned=(), quoted=tuple(sorted({*plan.pinned, *plan.quoted})))
