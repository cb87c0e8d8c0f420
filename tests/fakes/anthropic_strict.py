"""StrictAnthropic: a loopback Messages API that enforces Anthropic's documented rules on
preserved thinking, the context window and the thinking budget, as the docs state them.

    async with StrictAnthropic(window=80_000) as api:
        ... point the proxy's `upstream.anthropic_base_url` at api.base_url (".../v1") ...
        api.refused                      # what it answered 400, and why
        api.received, api.readable       # thinking blocks sent back on bound models, valid ones

Preserved thinking (platform docs `build-with-claude/preserved-thinking`,
`build-with-claude/preserved-thinking/prefix-checks`, and
`build-with-claude/preserved-thinking/fix-bound-to-a-different-conversation`; Bedrock's
`claude-messages-thinking-block-binding`): on the models that run the prefix check (globs in
`BOUND_MODELS`), a `thinking` or `redacted_thinking` block sent back is valid only while its
prefix, the top-level `system`, `tools` and every message and content block before it, is what
it was when the model produced it. Moving or removing `cache_control` markers and removing
thinking blocks do not count as edits (they are normalised out of the digest), but a thinking
block "between others left out or moved" does: each block is also bound to the thinking blocks
that came before it. Once one block fails, "that block and every later thinking block are
invalid". The fake signs each thinking block it emits with the digest of that prefix; a block it
did not sign is invalid too. A failing block is answered with the documented 400, or dropped
(and counted) when the request sets `thinking.block_binding.prefix_mismatch_behavior:
"drop_block"` with the beta `thinking-binding-controls-2026-08-01` in `anthropic-beta` (without
the beta, that setting is itself a 400). `on_mismatch="drop"` plays an account created before
2026-08-31, whose requests drop such blocks silently.

Also refused, as the API does: `prompt + max_tokens` over the model's window (`window`, counted
with the proxy's own estimator so tests and proxy agree on sizes), a thinking `budget_tokens`
below 1,024 or not below `max_tokens`. Models not matching `BOUND_MODELS` accept any thinking.

On-demand compaction (platform docs `build-with-claude/compaction-on-demand`,
`.../compaction-keep-recent-turns`, `.../compaction-thinking-blocks`): a request with
`"compaction": {"type": "summarize"}` needs the beta `compact-2026-09-04` and must not end in an
assistant turn whose tool call has no result; it is answered with one signed `compaction` block
(`compactions` counts them). A request carrying a block must carry exactly one, first in
`messages` (an assistant message of its own, or the first block of the first message), exactly
as returned, with the beta. For the prefix check the block stands for the messages it
summarized (the API "accepts the swap" when it wrote the summary): kept turns that follow it
unchanged keep their thinking valid while `system` and `tools` stay the same; a first kept turn
of the same role as the last summarized one is joined to it, as the API does (so its thinking
fails). `summary` is the block's text.

Answers stream (SSE events, thinking with its `signature_delta`) or not, as asked. What the
model says is `turn(payload)` (content blocks; thinking blocks without signatures: the fake
signs them); the proxy's own calls (`X-Compaction-Purpose`) are answered with a summary text.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.http.serving import serve_on_loopback
from tests.fakes.script import SUMMARY_TEXT, body_tokens

BOUND_MODELS = (
    "claude-fable-5*",
    "claude-mythos-5*",
    "claude-opus-5-5*",
    "claude-sonnet-5-5*",
    "claude-haiku-5-5*",
)
BINDING_BETA = "thinking-binding-controls-2026-08-01"
COMPACTION_BETA = "compact-2026-09-04"
MIN_BUDGET = 1024
_THINKING = ("thinking", "redacted_thinking")
_MISMATCH = (
    "messages.{m}.content.{c}: Invalid `signature` in `thinking` block. The block is bound to a "
    "different conversation. Remove the block, or set "
    '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
)

Turn = Callable[[dict[str, Any]], list[dict[str, Any]]]


def thinking_then_tool(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A Claude Code step: think, say a word, call the first tool offered (else just answer)."""
    step = len(payload.get("messages") or [])
    blocks: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": f"Step {step}: what to run next."},
        {"type": "text", "text": f"Running step {step}."},
    ]
    tools = [t for t in payload.get("tools") or [] if t.get("name") != "recall"]
    if tools:
        use = {"type": "tool_use", "id": f"toolu_{step}", "name": tools[0]["name"]}
        blocks.append({**use, "input": {"command": f"echo {step}"}})
    return blocks


@dataclass
class Refusal:
    model: str
    purpose: str | None
    message: str


@dataclass
class StrictAnthropic:
    window: int = 200_000
    turn: Turn = thinking_then_tool
    on_mismatch: str = "error"
    """"error" (accounts from 2026-08-31: the documented 400) or "drop" (older accounts)."""
    bound_models: Sequence[str] = BOUND_MODELS
    requests: list[dict[str, Any]] = field(default_factory=list)
    """The agent's requests, as received."""
    own_calls: list[dict[str, Any]] = field(default_factory=list)
    """The proxy's own calls (`X-Compaction-Purpose`), as received."""
    refused: list[Refusal] = field(default_factory=list)
    received: int = 0
    """Thinking blocks sent back to a bound model by the agent's requests."""
    readable: int = 0
    """Of those, the ones that passed the prefix check (the model read them)."""
    dropped: int = 0
    reads: list[tuple[int, int]] = field(default_factory=list)
    """Per agent request to a bound model: thinking blocks received, and readable."""
    compacts: bool = True
    """False: an API without on-demand compaction (a `compaction` request is a 400)."""
    betas: list[set[str]] = field(default_factory=list)
    """The `anthropic-beta` values of each agent request, as received."""
    compactions: int = 0
    """Compaction blocks issued."""
    summary: str = SUMMARY_TEXT
    """The text of the compaction blocks it issues."""
    _signed: dict[str, bytes] = field(default_factory=dict)
    _blocks: dict[str, tuple[dict[str, Any], list[Any]]] = field(default_factory=dict)
    """Each compaction block issued, by signature: the block, and the messages it stands for."""
    _serial: Any = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None
    base_url: str = ""

    async def __aenter__(self) -> StrictAnthropic:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/messages", self._handle)
        self._runner, url = await serve_on_loopback(app)
        self.base_url = f"{url}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def share_readable(self) -> float:
        return self.readable / self.received if self.received else 1.0

    def is_bound(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, glob) for glob in self.bound_models)

    # serving ---------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        purpose = request.headers.get("X-Compaction-Purpose")
        (self.requests if purpose is None else self.own_calls).append(
            orjson.loads(orjson.dumps(payload))
        )
        model = str(payload.get("model", ""))
        betas = {b.strip() for b in request.headers.get("anthropic-beta", "").split(",")}
        if purpose is None:
            self.betas.append(betas)
        problem = _budget_problem(payload) or self._window_problem(payload)
        problem = problem or self._compaction_problem(payload, betas)
        read, stood_for = payload, 0
        if problem is None:
            expanded, stood_for = self._expanded(payload.get("messages") or [])
            read = {**payload, "messages": expanded}
        if problem is None and self.is_bound(model):
            problem = self._check_thinking(read, betas, counted=purpose is None, after=stood_for)
        if problem is not None:
            self.refused.append(Refusal(model, purpose, problem))
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": problem},
            }
            return web.json_response(error, status=400)
        if payload.get("compaction") is not None:
            return web.json_response(self._compacted(payload, read["messages"]))
        if purpose is not None:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": SUMMARY_TEXT}]
            if _thinks(payload):
                blocks.insert(0, {"type": "thinking", "thinking": "What matters here."})
        else:
            blocks = self.turn(read)
        # Signed on what the check read; the prompt billed is what was sent (the block).
        message = self._message(read, blocks, prompt=body_tokens("/v1/messages", payload))
        if payload.get("stream") is True:
            return await _stream(request, message)
        return web.json_response(message)

    def _compaction_problem(self, payload: dict[str, Any], betas: set[str]) -> str | None:
        messages = payload.get("messages") or []
        found = [
            (m, c)
            for m, message in enumerate(messages)
            if isinstance(message.get("content"), list)
            for c, block in enumerate(message["content"])
            if isinstance(block, dict) and block.get("type") == "compaction"
        ]
        asks = payload.get("compaction") is not None
        if asks and not self.compacts:
            return "compaction: Extra inputs are not permitted"
        if (asks or found) and COMPACTION_BETA not in betas:
            return f"compaction: this feature needs the beta header `anthropic-beta: {COMPACTION_BETA}`"
        if found and found != [(0, 0)]:
            return "messages: send exactly one `compaction` block, first in `messages`"
        if found:
            block = messages[0]["content"][0]
            issued = self._blocks.get(str(block.get("signature")))
            if issued is None or issued[0] != block:
                return "messages.0.content.0: Invalid `signature` in `compaction` block"
        if asks and messages and messages[-1].get("role") == "assistant":
            content = messages[-1].get("content")
            if isinstance(content, list) and any(b.get("type") == "tool_use" for b in content):
                return "messages: a tool call without its result cannot be compacted"
        return None

    def _expanded(self, messages: list[Any]) -> tuple[list[Any], int]:
        """`messages` as the prefix check reads them: a leading compaction block stands for the
        messages it summarized (how many lead the list: their thinking was not sent); a first
        kept turn of their last one's role is joined to it."""
        if not messages or not isinstance(messages[0].get("content"), list):
            return messages, 0
        first = messages[0]["content"]
        if not (first and isinstance(first[0], dict) and first[0].get("type") == "compaction"):
            return messages, 0
        summarized = list(self._blocks[str(first[0].get("signature"))][1])
        rest = [{**messages[0], "content": first[1:]}] if first[1:] else []
        after = [*rest, *messages[1:]]
        if summarized and after and summarized[-1].get("role") == after[0].get("role"):
            last = summarized[-1]
            joined = _content(last.get("content")) + _content(after[0].get("content"))
            summarized[-1] = {**last, "content": joined}
            after = after[1:]
        return [*summarized, *after], len(summarized)

    def _compacted(self, payload: dict[str, Any], summarized: list[Any]) -> dict[str, Any]:
        self.compactions += 1
        signature = f"cmp-sig-{next(self._serial)}"
        block = {"type": "compaction", "content": self.summary, "signature": signature}
        self._blocks[signature] = (block, orjson.loads(orjson.dumps(summarized)))
        message = self._message(payload, [], prompt=body_tokens("/v1/messages", payload))
        return {
            **message,
            "content": [orjson.loads(orjson.dumps(block))],
            "stop_reason": "end_turn",
        }

    def _window_problem(self, payload: dict[str, Any]) -> str | None:
        prompt = body_tokens("/v1/messages", payload)
        asked = payload.get("max_tokens")
        if not isinstance(asked, int) or asked < 1:
            return "max_tokens: Field required"
        if prompt + asked > self.window:
            return (
                f"input length and `max_tokens` exceed context limit: {prompt} + {asked} > "
                f"{self.window}, decrease input length or `max_tokens` and try again"
            )
        return None

    def _check_thinking(
        self, payload: dict[str, Any], betas: set[str], *, counted: bool, after: int = 0
    ) -> str | None:
        """Check the thinking blocks of `payload`, counting those at message `after` or later
        (before it: what a compaction block stands for, not sent)."""
        binding = (payload.get("thinking") or {}).get("block_binding")
        behavior = (binding or {}).get("prefix_mismatch_behavior", self._default_behavior())
        if binding is not None and BINDING_BETA not in betas:
            return (
                "thinking.block_binding: this field needs the beta header "
                f"`anthropic-beta: {BINDING_BETA}`"
            )
        failed = False
        received, readable = self.received, self.readable
        chain: list[str] = []
        kept_messages = []
        for m, message in enumerate(payload.get("messages") or []):
            content = message.get("content")
            if not isinstance(content, list):
                kept_messages.append(message)
                continue
            kept: list[Any] = []
            for c, block in enumerate(content):
                if not (isinstance(block, dict) and block.get("type") in _THINKING):
                    kept.append(block)
                    continue
                sent = counted and m >= after
                if sent:
                    self.received += 1
                signature = str(block.get("signature") or block.get("data") or "")
                digest = _digest(payload, payload["messages"][:m], content[:c], chain)
                failed = failed or self._signed.get(signature) != digest
                if not failed:
                    chain.append(signature)
                    kept.append(block)
                    self.readable += sent
                    continue
                if behavior != "drop_block":
                    return _MISMATCH.format(m=m, c=c)
                self.dropped += 1
            kept_messages.append({**message, "content": kept})
        payload["messages"] = kept_messages  # what the model reads
        if counted:  # per agent request
            self.reads.append((self.received - received, self.readable - readable))
        return None

    def _default_behavior(self) -> str:
        return "drop_block" if self.on_mismatch == "drop" else "error"

    def _message(
        self, payload: dict[str, Any], blocks: list[dict[str, Any]], prompt: int | None = None
    ) -> dict[str, Any]:
        messages = payload.get("messages") or []
        chain = [
            str(b.get("signature") or b.get("data"))
            for m in messages
            if isinstance(m.get("content"), list)
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") in _THINKING
        ]
        signed: list[dict[str, Any]] = []
        for block in blocks:
            if block["type"] == "thinking":
                signature = f"sig-{next(self._serial)}"
                self._signed[signature] = _digest(payload, messages, signed, chain)
                block = {**block, "signature": signature}
                chain.append(signature)
            signed.append(block)
        calls = any(b["type"] == "tool_use" for b in signed)
        return {
            "id": f"msg_{next(self._serial)}",
            "type": "message",
            "role": "assistant",
            "model": payload.get("model"),
            "content": signed,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt or body_tokens("/v1/messages", payload),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 20,
            },
        }


def _content(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def _thinks(payload: dict[str, Any]) -> bool:
    thinking = payload.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def _budget_problem(payload: dict[str, Any]) -> str | None:
    thinking = payload.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < MIN_BUDGET:
        return (
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_BUDGET}"
        )
    asked = payload.get("max_tokens")
    if isinstance(asked, int) and budget >= asked:
        return "`max_tokens` must be greater than `thinking.budget_tokens`"
    return None


def _digest(
    payload: dict[str, Any], before: Sequence[Any], partial: Sequence[Any], chain: Sequence[str]
) -> bytes:
    """The prefix a thinking block is bound to: system, tools, the messages before it and the
    blocks before it in its own message, with cache_control and thinking normalised out, and the
    thinking blocks that came before it (none of them may be left out or moved)."""
    prefix = {
        "system": _normal(payload.get("system")),
        "tools": _normal(payload.get("tools")),
        "messages": [_normal(m) for m in before],
        "partial": _normal(list(partial)),
        "chain": list(chain),
    }
    return hashlib.sha256(orjson.dumps(prefix, option=orjson.OPT_SORT_KEYS)).digest()


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        # A message's string content is read as one text block, whatever its role: Claude Code
        # sends its `system`-role message as blocks first and as a string on later turns.
        if "role" in value and isinstance(value.get("content"), str):
            value = {**value, "content": [{"type": "text", "text": value["content"]}]}
        return {k: _normal(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [
            _normal(v) for v in value if not (isinstance(v, dict) and v.get("type") in _THINKING)
        ]
    return value


async def _stream(request: web.Request, message: dict[str, Any]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    start = {**message, "content": [], "stop_reason": None}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        elif kind == "text":
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        else:
            opened = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
            ]
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": 20},
        },
        {"type": "message_stop"},
    ]
    for event in events:
        data = orjson.dumps(event)
        await response.write(b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n")
    await response.write_eof()
    return response
