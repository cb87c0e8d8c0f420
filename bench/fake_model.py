"""A deterministic model that answers a question from what it is sent, and calls `recall` when the
answer is not there: the upstream of bench.recall, a real aiohttp server on loopback speaking the
three dialects (chat completions, Responses, Anthropic Messages), whole and streamed.

It reads a question as its key terms (its words less common ones). A line of its context that
holds every key term (a word starting with the term's first five letters) is the answer; the
latest such line when several do. Without one, and when the request offers a `recall` tool, it
calls `recall` with the key terms; given recall's result, it answers with the line of the result
(or else of its context) that holds the most key terms, the first of the result at equal count.
Without recall it answers with the best line it has. Summary and memory calls
(`X-Compaction-Purpose`) get one generic sentence and an empty list: what was folded is in the
proxy's archive and in the pinned instructions only.

Only requests carrying an `X-Bench-Question` header are questions (the others, the agent's work,
get "Done."); each call's time inside the handler is added up per question, so the bench can take
the upstream's share out of what the client waited.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

GENERIC_SUMMARY = "The user and the assistant worked through several items of the project."
QUESTION = "X-Bench-Question"
RECALL = "recall"
CALL_PREFIX = "call_recall_"
SUPERSEDED = "superseded by a later statement"
_STEM = 5
_WORD = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "all",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "being",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "done",
        "earlier",
        "else",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "may",
        "might",
        "must",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "output",
        "say",
        "said",
        "says",
        "should",
        "so",
        "such",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "to",
        "tool",
        "under",
        "until",
        "up",
        "upon",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


def key_terms(question: str) -> list[str]:
    """The question's words less common ones, in order, each once."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(question.lower()):
        if len(word) >= 3 and word not in STOPWORDS:
            seen.setdefault(word, None)
    return list(seen)


def held(line: str, terms: list[str]) -> int:
    """How many of `terms` the line holds (a word starting with the term's first letters)."""
    words = _WORD.findall(line.lower())
    return sum(any(word.startswith(term[:_STEM]) for word in words) for term in terms)


def best_line(lines: list[str], terms: list[str], *, latest: bool) -> tuple[str, int]:
    """The line holding the most terms (at equal count the latest, or the first) and the
    count. A line the summary marks as superseded is read as stale, as a model would."""
    best, count = "", 0
    for line in reversed(lines) if latest else lines:
        if SUPERSEDED in line:
            continue
        score = held(line, terms)
        if score > count:
            best, count = line, score
    return best, count


@dataclass
class Turns:
    """What a request says, read the same way in every dialect."""

    question: str
    context: list[str]
    recalled: str | None
    """The result of this model's recall call, when the request ends with it."""
    offers_recall: bool


def read_turns(dialect: str, body: dict[str, Any]) -> Turns:
    # (who, text): who is "user", "result" (of this model's recall call) or "other"
    texts: list[tuple[str, str]] = []
    if dialect == "chat":
        for message in body.get("messages", []):
            role = message.get("role")
            mine = role == "tool" and _is_mine(message.get("tool_call_id"))
            who = "result" if mine else "user" if role == "user" else "other"
            texts.append((who, _text(message.get("content"))))
        tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    elif dialect == "responses":
        texts.append(("other", _text(body.get("instructions"))))
        for item in body.get("input", []):
            kind = item.get("type", "message")
            if kind == "function_call_output":
                who = "result" if _is_mine(item.get("call_id")) else "other"
                texts.append((who, _text(item.get("output"))))
            elif kind == "message":
                who = "user" if item.get("role") == "user" else "other"
                texts.append((who, _text(item.get("content"))))
        tools = [t.get("name") for t in body.get("tools") or []]
    else:
        texts.append(("other", _text(body.get("system"))))
        for message in body.get("messages", []):
            content = message.get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            for block in blocks:
                if block.get("type") == "tool_result":
                    who = "result" if _is_mine(block.get("tool_use_id")) else "other"
                    texts.append((who, _text(block.get("content"))))
                elif block.get("type") == "text":
                    who = "user" if message.get("role") == "user" else "other"
                    texts.append((who, _text(block.get("text"))))
        tools = [t.get("name") for t in body.get("tools") or []]
    asked = max((i for i, (who, _) in enumerate(texts) if who == "user"), default=-1)
    question = texts[asked][1] if asked >= 0 else ""
    recalled = (
        texts[-1][1] if texts and texts[-1][0] == "result" and asked < len(texts) - 1 else None
    )
    context = [
        line
        for i, (_, text) in enumerate(texts)
        if i != asked and (recalled is None or i != len(texts) - 1)
        for line in text.splitlines()
    ]
    return Turns(question, context, recalled, RECALL in tools)


def _is_mine(call_id: object) -> bool:
    return isinstance(call_id, str) and call_id.startswith(CALL_PREFIX)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(part.get("text")) for part in content if isinstance(part, dict))
    return ""


def decide(turns: Turns) -> tuple[str, str | None]:
    """(the answer, "") or ("", the recall query)."""
    terms = key_terms(turns.question)
    if turns.recalled is not None:
        # Not the result's header, which quotes the query; a line of a turn may hold the
        # terms in the query's order (the answer often does), and is read.
        asked = " ".join(terms)
        quoted = (f"'{asked}'", f'"{asked}"')
        lines = [line for line in turns.recalled.splitlines() if not any(q in line for q in quoted)]
        found, count = best_line(lines, terms, latest=False)
        known, known_count = best_line(turns.context, terms, latest=True)
        return (found if count >= known_count else known), None
    line, count = best_line(turns.context, terms, latest=True)
    if count == len(terms) or not turns.offers_recall:
        return line or "I do not know.", None
    return "", " ".join(terms)


@dataclass
class FakeModel:
    """The upstream: `handle` answers every dialect's path."""

    busy_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Recall calls made, per `X-Bench-Question`."""
    recalled: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """The recall results read, per `X-Bench-Question`."""
    summary_calls: int = 0
    _ids: int = 0

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/responses", self._responses),
            web.post("/v1/messages", self._anthropic),
        ]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "responses")

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "anthropic")

    async def _handle(self, request: web.Request, dialect: str) -> web.StreamResponse:
        started = time.perf_counter()
        body = orjson.loads(await request.read())
        purpose = request.headers.get("X-Compaction-Purpose")
        stream = bool(body.get("stream"))
        if purpose is not None:
            text = GENERIC_SUMMARY if purpose == "summary" else "[]"
            response = await _reply(request, dialect, text, None, stream)
        elif QUESTION not in request.headers:  # the agent's work, not a question: not measured
            response = await _reply(request, dialect, "Done.", None, stream)
        else:
            turns = read_turns(dialect, body)
            if turns.recalled is not None:
                self.recalled[request.headers[QUESTION]].append(turns.recalled)
            answer, query = decide(turns)
            call = None
            if query is not None:
                self.calls[request.headers[QUESTION]] += 1
                self._ids += 1
                call = (f"{CALL_PREFIX}{self._ids}", orjson.dumps({"query": query}).decode())
            response = await _reply(request, dialect, answer, call, stream)
        self.busy_s[request.headers.get(QUESTION, "")] += time.perf_counter() - started
        return response


async def _reply(
    request: web.Request,
    dialect: str,
    text: str,
    call: tuple[str, str] | None,
    stream: bool,
) -> web.StreamResponse:
    if not stream:
        return web.json_response(WHOLE[dialect](text, call))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in EVENTS[dialect](text, call):
        await response.write(event)
    await response.write_eof()
    return response


_USAGE_CHAT = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
_USAGE_ANTHROPIC = {"input_tokens": 100, "output_tokens": 5}
_USAGE_RESPONSES = {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105}


def _chat_whole(text: str, call: tuple[str, str] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if call is not None:
        function = {"name": RECALL, "arguments": call[1]}
        message["tool_calls"] = [{"id": call[0], "type": "function", "function": function}]
    finish = "tool_calls" if call is not None else "stop"
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return {"id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000,
            "model": "bench-model", "choices": [choice], "usage": _USAGE_CHAT}  # fmt: skip


def _responses_whole(text: str, call: tuple[str, str] | None) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if text:
        output.append(_responses_message(text))
    if call is not None:
        output.append(_responses_call(call))
    return {"id": "resp_bench", "object": "response", "created_at": 1700000000,
            "status": "completed", "model": "bench-model", "output": output,
            "usage": _USAGE_RESPONSES}  # fmt: skip


def _responses_message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_bench", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _responses_call(call: tuple[str, str]) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call[0]}", "call_id": call[0], "name": RECALL,
            "arguments": call[1], "status": "completed"}  # fmt: skip


def _anthropic_whole(text: str, call: tuple[str, str] | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if call is not None:
        content.append({"type": "tool_use", "id": call[0], "name": RECALL,
                        "input": orjson.loads(call[1])})  # fmt: skip
    return {"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-model",
            "content": content, "stop_reason": "tool_use" if call else "end_turn",
            "stop_sequence": None, "usage": _USAGE_ANTHROPIC}  # fmt: skip


def _sse(payload: Any, name: str | None = None) -> bytes:
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def _chat_events(text: str, call: tuple[str, str] | None) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse({"id": "chatcmpl-bench", "object": "chat.completion.chunk",
                     "created": 1700000000, "model": "bench-model", "choices": [choice]})  # fmt: skip

    events = [chunk({"role": "assistant", "content": ""})]
    half = len(text) // 2
    events += [chunk({"content": piece}) for piece in (text[:half], text[half:]) if piece]
    if call is not None:
        start = {"index": 0, "id": call[0], "type": "function",
                 "function": {"name": RECALL, "arguments": ""}}  # fmt: skip
        events.append(chunk({"tool_calls": [start]}))
        events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": call[1]}}]}))
    events.append(chunk({}, "tool_calls" if call is not None else "stop"))
    usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
             "model": "bench-model", "choices": [], "usage": _USAGE_CHAT}  # fmt: skip
    return [*events, _sse(usage), b"data: [DONE]\n\n"]


def _responses_events(text: str, call: tuple[str, str] | None) -> list[bytes]:
    done = _responses_whole(text, call)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**done, "status": "in_progress",
                                                  "output": [], "usage": None}},
    ]  # fmt: skip
    for index, item in enumerate(done["output"]):
        if item["type"] == "message":
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "content": []}})  # fmt: skip
            events.append({"type": "response.content_part.added", "item_id": item["id"],
                           "output_index": index, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": []}})  # fmt: skip
            events.append({"type": "response.output_text.delta", "item_id": item["id"],
                           "output_index": index, "content_index": 0, "delta": text})  # fmt: skip
            events.append({"type": "response.output_text.done", "item_id": item["id"],
                           "output_index": index, "content_index": 0, "text": text})  # fmt: skip
            events.append({"type": "response.content_part.done", "item_id": item["id"],
                           "output_index": index, "content_index": 0,
                           "part": item["content"][0]})  # fmt: skip
        else:
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "arguments": ""}})  # fmt: skip
            events.append({"type": "response.function_call_arguments.delta",
                           "item_id": item["id"], "output_index": index,
                           "delta": item["arguments"]})  # fmt: skip
            events.append({"type": "response.function_call_arguments.done",
                           "item_id": item["id"], "output_index": index,
                           "arguments": item["arguments"]})  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": done})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return [_sse(event, event["type"]) for event in events]


def _anthropic_events(text: str, call: tuple[str, str] | None) -> list[bytes]:
    whole = _anthropic_whole(text, call)
    start = {**whole, "content": [], "stop_reason": None,
             "usage": {**_USAGE_ANTHROPIC, "output_tokens": 1}}  # fmt: skip
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": orjson.dumps(block["input"]).decode(),
            }
        events += [
            {"type": "content_block_start", "index": index, "content_block": opened},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]
    events += [
        {"type": "message_delta", "delta": {"stop_reason": whole["stop_reason"],
                                            "stop_sequence": None}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return [_sse(event, event["type"]) for event in events]


WHOLE = {"chat": _chat_whole, "responses": _responses_whole, "anthropic": _anthropic_whole}
EVENTS = {"chat": _chat_events, "responses": _responses_events, "anthropic": _anthropic_events}


def answer_text(dialect: str, body: bytes, streamed: bool) -> tuple[str, bool]:
    """What the client received: the answer's text, and whether it saw a `recall` call."""
    if not streamed:
        payload = orjson.loads(body)
        if dialect == "chat":
            message = payload["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            return message.get("content") or "", any(c["function"]["name"] == RECALL for c in calls)
        if dialect == "responses":
            items = payload.get("output", [])
            text = "".join(
                part.get("text", "") for item in items if item.get("type") == "message"
                for part in item.get("content", [])
            )  # fmt: skip
            return text, any(i.get("name") == RECALL for i in items)
        blocks = payload.get("content", [])
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        return text, any(b.get("name") == RECALL for b in blocks)
    text, leaked = [], False
    for line in body.splitlines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = orjson.loads(line[6:])
        if dialect == "chat":
            for choice in event.get("choices", []):
                delta = choice.get("delta", {})
                text.append(delta.get("content") or "")
                calls = delta.get("tool_calls") or []
                leaked |= any(c.get("function", {}).get("name") == RECALL for c in calls)
        elif dialect == "responses":
            if event.get("type") == "response.output_text.delta":
                text.append(event["delta"])
            leaked |= event.get("item", {}).get("name") == RECALL
        elif event.get("type") == "content_block_delta":
            text.append(event["delta"].get("text", ""))
        else:
            leaked |= event.get("content_block", {}).get("name") == RECALL
    return "".join(text), leaked
