"""compaction: decide what to fold in a chat history, summarize it, flush memory, verify.

Chat completions messages by default; Responses items (`shape=RESPONSES`) and Anthropic messages
(`shape=ANTHROPIC`, sent as `join_summary(result.messages)`) too.

A pure library: no HTTP, no environment, no files except the memory writer. Whatever needs I/O
(the summarizing LLM, the token counter) is a Protocol passed in.

    compactor = Compactor(memory=MemoryWriter("./memory"))
    tokens = compactor.estimate(messages, tools)
    if compactor.needs_compaction(tokens, window):
        compaction = await compactor.prepare(messages, window=window, tools=tools)
        result = await compaction.run(llm=my_llm, session_id="agent-1")
        messages = result.messages

The CPU work runs inline unless `Compactor(offload=...)` gives an `Offload` that runs it in
another process (the proxy's worker pool); `prepare` then takes `messages_json=JsonArray(...)`
when the caller holds the messages' JSON already. The texts a fold scanned for facts are kept
so a longer fold scans only new ones: `Compactor(mentions=MentionCache(max_chars))` inline, and
`worker_mentions()` in each process an `Offload` sends jobs to (its `max_chars` may be set there).

Checkpoints (compaction.checkpoints) remember a compaction under a digest of the prefix it
folded, so a server that sees the same history again substitutes it instead of compacting anew.
"""

from __future__ import annotations

from compaction.checkpoints import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointCache,
    CheckpointStore,
    DigestPrefix,
    Layout,
    View,
    checkpoint_after,
    conversation_seed,
    plan_key,
    prefix_digests,
)
from compaction.compactor import Compaction, Compactor
from compaction.engine import CompactionEngine
from compaction.extract import extract_items_heuristically, parse_memory_reply
from compaction.ledger import Ledger, build_ledger
from compaction.marker import PREVIEW_MARK, SUMMARY_MARKER
from compaction.memory import (
    InvalidSessionId,
    ItemClaims,
    MemoryWriter,
    is_valid_session_id,
    prune_memory,
)
from compaction.mentions import MentionCache
from compaction.messages import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    Item,
    Kind,
    Shape,
    ToolCall,
    blocks_text,
    content_text,
    is_message_item,
    is_summary_message,
    join_summary,
    message_text,
    read_items,
    strip_injected,
)
from compaction.offload import Inline, JsonArray, Offload, OffloadLost
from compaction.plan import Trigger, room_for_prompt
from compaction.settings import CompactionSettings, Strategy
from compaction.stages import worker_mentions
from compaction.summarize import is_substantive, recall_note, summary_message, summary_text
from compaction.tokens import REPLY_PRIMING_TOKENS, HeuristicEstimator, estimate_request
from compaction.transcript import render_transcript
from compaction.types import (
    Block,
    ChatLLM,
    CompactionResult,
    MemoryItem,
    Message,
    Plan,
    PrefixLLM,
    Purpose,
    Round,
    Segments,
    TokenEstimator,
    Tools,
    Verification,
)
from compaction.verify import check_preserved

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "CHECKPOINT_VERSION",
    "PREVIEW_MARK",
    "REPLY_PRIMING_TOKENS",
    "RESPONSES",
    "SUMMARY_MARKER",
    "Block",
    "ChatLLM",
    "Checkpoint",
    "CheckpointCache",
    "CheckpointStore",
    "Compaction",
    "CompactionEngine",
    "CompactionResult",
    "CompactionSettings",
    "Compactor",
    "DigestPrefix",
    "HeuristicEstimator",
    "Inline",
    "InvalidSessionId",
    "Item",
    "ItemClaims",
    "JsonArray",
    "Kind",
    "Layout",
    "Ledger",
    "MemoryItem",
    "MemoryWriter",
    "MentionCache",
    "Message",
    "Offload",
    "OffloadLost",
    "Plan",
    "PrefixLLM",
    "Purpose",
    "Round",
    "Segments",
    "Shape",
    "Strategy",
    "TokenEstimator",
    "ToolCall",
    "Tools",
    "Trigger",
    "Verification",
    "View",
    "blocks_text",
    "build_ledger",
    "check_preserved",
    "checkpoint_after",
    "content_text",
    "conversation_seed",
    "estimate_request",
    "extract_items_heuristically",
    "is_message_item",
    "is_substantive",
    "is_summary_message",
    "is_valid_session_id",
    "join_summary",
    "message_text",
    "parse_memory_reply",
    "plan_key",
    "prefix_digests",
    "prune_memory",
    "read_items",
    "recall_note",
    "render_transcript",
    "room_for_prompt",
    "strip_injected",
    "summary_message",
    "summary_text",
    "worker_mentions",
]
