"""Anthropic's on-demand compaction as the proxy's summarizer (`compaction.summarizer: native`).

The request (platform.claude.com/docs/en/build-with-claude/compaction-on-demand, and
`.../compaction-keep-recent-turns`): the turns to fold, with the conversation's own `system`
and `tools`, a top-level `"compaction": {"type": "summarize"}` and the beta
`anthropic-beta: compact-2026-09-04`; the answer is one signed `compaction` block, which then
goes first in `messages`, "in place of the messages it summarizes", exactly as returned, and
the kept turns follow it as they were, with the beta on every request that carries it.

Why the proxy asks for it: on a model with preserved thinking the thinking of the kept turns
stays valid after such a compaction (`.../compaction-thinking-blocks`) while three things hold:
every compaction request since the thinking was written ran on a preserved-thinking model; the
kept turns follow the summarized messages directly, unchanged, nothing skipped or added between
them, the first kept turn of another role than the last summarized one; `system` and `tools`
are the same in the compaction request, the turn that thought, and every request after. So the
proxy adds nothing between the block and the kept turns (no pinned turn, no summary text) and
leaves `tools` alone (no `recall` tool).

Inside the proxy the block rides in the checkpoint's summary message (a summary of the
library's, built by code: what a fallback and the next compaction read) under `_BLOCK`; only
`wire` puts the block itself on the wire, in that message's place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from multidict import MultiMapping

from compaction import Message

BETA = "compact-2026-09-04"
_BETA_HEADER = "anthropic-beta"
_BLOCK = "compaction_block"
"""The key of a summary message that holds the block it stands for (never on the wire)."""
_BLOCK_BYTES = b'"type":"compaction"'


def request_body(payload: Mapping[str, object], folded: list[Message], max_tokens: int) -> bytes:
    """The compaction request over `folded` (in wire form), with the conversation's own
    `system` and `tools` (as sent: they must match the requests before and after)."""
    body: dict[str, object] = {"model": payload.get("model"), "max_tokens": max_tokens}
    for key in ("system", "tools"):
        if key in payload:
            body[key] = payload[key]
    body["messages"] = folded
    body["compaction"] = {"type": "summarize"}
    return orjson.dumps(body)


def request_headers(incoming: Mapping[str, str]) -> dict[str, str]:
    """The client's `anthropic-beta` with the compaction beta added (when it is missing)."""
    # A client may send its betas on several header lines: all of them are kept.
    lines = incoming.getall(_BETA_HEADER, []) if isinstance(incoming, MultiMapping) else []
    said = ",".join(lines) if lines else incoming.get(_BETA_HEADER, "")
    betas = [b.strip() for b in said.split(",") if b.strip()]
    if BETA in betas:
        return {}
    return {_BETA_HEADER: ",".join([*betas, BETA])}


def beta_for(body: bytes, incoming: Mapping[str, str]) -> dict[str, str]:
    """The header a forwarded `body` needs: the beta whenever it carries a compaction block
    (ours or the client's; the client's own comes with its beta already)."""
    return request_headers(incoming) if _BLOCK_BYTES in body else {}


def block_of(answer: object) -> dict[str, Any] | None:
    """The one `compaction` block of a compaction request's answer; None for anything else."""
    content = answer.get("content") if isinstance(answer, dict) else None
    if not isinstance(content, list) or len(content) != 1:
        return None
    block = content[0]
    if not isinstance(block, dict) or block.get("type") != "compaction":
        return None
    return block


def carrying(summary: Message, block: dict[str, Any]) -> Message:
    """The summary message `summary` standing for `block` (a new dict)."""
    return {**summary, _BLOCK: block}


def is_native(message: object) -> bool:
    return isinstance(message, dict) and _BLOCK in message


def has_native(messages: Sequence[Message]) -> bool:
    """True when `messages` lead with a native summary (it is always first)."""
    return bool(messages) and is_native(messages[0])


def wire(messages: list[Message]) -> list[Message] | None:
    """`messages` with their native summary (always first: nothing comes before a block)
    replaced by its block: an `assistant` message of its own, or the first block of the next
    message when that one is the assistant's (two assistant turns in a row would be joined);
    None when the first message is no native summary."""
    if not messages or not is_native(messages[0]):
        return None
    block = messages[0][_BLOCK]
    after = messages[1] if len(messages) > 1 else None
    if isinstance(after, dict) and after.get("role") == "assistant":
        content = after.get("content")
        text = [{"type": "text", "text": content}] if content else []  # "" is no text block
        rest = content if isinstance(content, list) else text
        return [{**after, "content": [block, *rest]}, *messages[2:]]
    return [{"role": "assistant", "content": [block]}, *messages[1:]]


class OnDemand:
    """The dialect's `native` (proxy.dialects.base.NativeCompaction): the functions above."""

    request_body = staticmethod(request_body)
    request_headers = staticmethod(request_headers)
    beta_for = staticmethod(beta_for)
    block_of = staticmethod(block_of)
    carrying = staticmethod(carrying)
    has_native = staticmethod(has_native)


ON_DEMAND = OnDemand()
