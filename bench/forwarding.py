"""One conversation's requests forwarded through the library as the proxy drives it, for the
benchmarks that replay without HTTP (bench.canaries, bench.retention).

Each request takes its longest remembered checkpoint; when the view reaches the trigger it is
compacted once more (an update of the summary when a checkpoint was applied) and the new
checkpoint is remembered. `forward(end)` gives what the model receives for the request that is
the conversation's first `end` messages, and the compaction it ran, if any.
"""

from __future__ import annotations

from dataclasses import dataclass

from compaction import ChatLLM, CompactionResult, CompactionSettings, Compactor, Strategy, Tools
from compaction.checkpoints import (
    CheckpointCache,
    View,
    checkpoint_after,
    find_longest,
    prefix_digests,
)
from compaction.settings import TARGET_RATIO
from compaction.types import Message


@dataclass(frozen=True)
class Forwarded:
    messages: list[Message]
    """What the model receives: the request itself when nothing applied."""
    result: CompactionResult | None
    """The compaction this request ran (None: none, or one that left it unchanged)."""
    changed: bool
    """A checkpoint applied or a compaction ran: what the model receives is not the request."""


class Forwarder:
    def __init__(
        self,
        messages: list[Message],
        *,
        seed: bytes,
        window: int,
        llm: ChatLLM | None,
        tools: Tools = None,
        strategy: Strategy = "hybrid",
        target_ratio: float = TARGET_RATIO,
    ) -> None:
        self._messages = messages
        self._window = window
        self._llm = llm
        self._tools = tools
        self._compactor = Compactor(
            settings=CompactionSettings(
                llm_timeout_s=5, strategy=strategy, target_ratio=target_ratio
            )
        )
        self._store = CheckpointCache()
        self._digests = prefix_digests(messages, seed)

    async def forward(self, end: int) -> Forwarded:
        prefix = self._messages[:end]
        digests = self._digests[:end]
        view = View.of(prefix, find_longest(self._store, digests))
        forwarded = view.messages
        tokens = self._compactor.estimate(forwarded, self._tools)
        applied = view.base is not None
        if not self._compactor.needs_compaction(tokens, self._window):
            return Forwarded(forwarded, None, applied)
        compaction = await self._compactor.prepare(
            forwarded, window=self._window, tools=self._tools
        )
        result = await compaction.run(llm=self._llm, session_id=None)
        if result.path == "unchanged":
            return Forwarded(forwarded, None, applied)
        checkpoint = checkpoint_after(view, result, digests)
        if checkpoint is not None:
            self._store.put(checkpoint)
        return Forwarded(result.messages, result, True)
