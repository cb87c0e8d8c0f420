"""The decision for a request recognized as the continuation of a known one (proxy.compacting.
known), made from what is remembered: no full parse, no re-hashing, no re-counting.

It settles the two cases that are most requests of a long conversation: below the trigger with
nothing to do (`none`), and a remembered checkpoint whose view fits (`reused`). Everything else
(a compaction to run, a precompute to start, a reserve checkpoint, an estimate too close to the
trigger to trust the per-item rounding) is left to the full path: `decide` returns None.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from compaction import HeuristicEstimator
from compaction.checkpoints import Checkpoint
from compaction.tokens import REPLY_PRIMING_TOKENS
from proxy.compacting.chat import ChatRequest
from proxy.compacting.conversations import Conversations
from proxy.compacting.known import Known, Part
from proxy.compacting.precompute import Precompute

# The remembered counts are per item at calibration 1 and scaled as a sum, the full path rounds
# per item: within this margin of the trigger the full path decides.
_TRIGGER_MARGIN = 1.01


@dataclass(frozen=True)
class Recalled:
    status: str
    tokens_before: int
    tokens_after: int
    checkpoint: Checkpoint | None
    body: bytes


async def decide(
    chat: ChatRequest, known: Known, conversations: Conversations, precompute: Precompute
) -> Recalled | None:
    fixed = chat.estimator.count_tools(chat.tools) + REPLY_PRIMING_TOKENS
    before = estimate_known(chat, known)
    checkpoint = await conversations.latest(known.digests, known.count)
    if checkpoint is None:
        after, parts = before, None
    elif checkpoint.precomputed or checkpoint.cut > known.count:
        return None
    else:
        after = round(_view_tokens(known, checkpoint) * chat.factor) + fixed
        parts = _view_parts(known, checkpoint)
    if checkpoint is None and conversations.needs(chat, before):
        return None
    if conversations.needs(chat, int(after * _TRIGGER_MARGIN) + 1):
        return None
    if precompute.would_start(chat, after, before):
        return None
    if parts is None:
        return Recalled("none", before, after, None, known.body)
    return Recalled("reused", before, after, checkpoint, known.splice(parts))


def estimate_known(chat: ChatRequest, known: Known) -> int:
    """The request's estimate from the remembered counts (the full path's, up to rounding)."""
    fixed = chat.estimator.count_tools(chat.tools) + REPLY_PRIMING_TOKENS
    return round(known.tokens[known.count] * chat.factor) + fixed


def _view_tokens(known: Known, checkpoint: Checkpoint) -> int:
    tokens = known.tokens
    pinned = sum(tokens[i + 1] - tokens[i] for i in checkpoint.pinned)
    summary = HeuristicEstimator().count_message(checkpoint.summary_message)
    kept = tokens[known.count] - tokens[checkpoint.cut]
    return tokens[checkpoint.head_end] + summary + pinned + kept


def _view_parts(known: Known, checkpoint: Checkpoint) -> list[Part]:
    """Checkpoint.apply, as splice parts (the same bytes the full path would splice)."""
    return [
        *range(checkpoint.head_end),
        orjson.dumps(checkpoint.summary_message),
        *checkpoint.pinned,
        *range(checkpoint.cut, known.count),
    ]
