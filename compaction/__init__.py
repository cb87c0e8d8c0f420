"""compaction: decide what to fold in a chat history, summarize it, flush memory, verify.

Chat completions messages by default; Responses items (`shape=RESPONSES`) and Anthropic messages
(`shape=ANTHROPIC`, sent as `join_summary(result.messages)`) too.

A pure library: no HTTP, no environment, no files except the memory writer. Whatever needs I/O
(the summarizing LLM, the token counter) is a Protocol passed in.

    compactor = Compactor(memory=MemoryWriter("./memory"))
    tokens = compactor.estimate(messages, tools)
    if compactor.needs_compaction(tokens, window):
        plan = compactor.plan(messages, window=window, tools=tools)
        result = await compactor.run(messages, plan, llm=my_llm, session_id="agent-1", tools=tools)
        messages = result.messages
"""

from __future__ import annotations

from compaction.compactor import Compactor
from compaction.engine import CompactionEngine
from compaction.extract import extract_items_heuristically, parse_memory_reply
from compaction.ledger import Ledger, build_ledger
from compaction.marker import SUMMARY_MARKER
from compaction.memory import InvalidSessionId, MemoryWriter
from compaction.messages import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    Item,
    Kind,
    Shape,
    ToolCall,
    is_summary_message,
    join_summary,
    message_text,
    read_items,
)
from compaction.settings import CompactionSettings
from compaction.summarize import is_substantive, summary_message, summary_text
from compaction.tokens import HeuristicEstimator, estimate_request
from compaction.transcript import render_transcript
from compaction.types import (
    Block,
    ChatLLM,
    CompactionResult,
    MemoryItem,
    Message,
    Plan,
    Round,
    Segments,
    TokenEstimator,
    Verification,
)
from compaction.verify import check_preserved

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "RESPONSES",
    "SUMMARY_MARKER",
    "Block",
    "ChatLLM",
    "CompactionEngine",
    "CompactionResult",
    "CompactionSettings",
    "Compactor",
    "HeuristicEstimator",
    "InvalidSessionId",
    "Item",
    "Kind",
    "Ledger",
    "MemoryItem",
    "MemoryWriter",
    "Message",
    "Plan",
    "Round",
    "Segments",
    "Shape",
    "TokenEstimator",
    "ToolCall",
    "Verification",
    "build_ledger",
    "check_preserved",
    "estimate_request",
    "extract_items_heuristically",
    "is_substantive",
    "is_summary_message",
    "join_summary",
    "message_text",
    "parse_memory_reply",
    "read_items",
    "render_transcript",
    "summary_message",
    "summary_text",
]
