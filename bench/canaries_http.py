"""The canaries protocol (bench/canaries.py) through the proxy over HTTP, in all three dialects.

    .venv/bin/python -m bench.canaries --http [--dialects chat responses anthropic] [...]

The same sessions, growth and probe as the library's run, but every request of the replay is
a real HTTP request to the proxy (`create_app` on loopback, state in memory, precompute off so a
compaction happens at the trigger as in the library's run) in front of a fake upstream on
loopback that answers the agent's requests, plays the summarizer (generic, extractive, or none:
it answers the proxy's summary and memory calls with an HTTP 500, so the proxy falls back to the
summary built by code) and keeps the last request it was forwarded per session. At each growth
mark the kit's probe reads that forwarded request's text. Requests are converted by
bench.dialects (Responses: reasoning items, `instructions`; Anthropic: thinking blocks, `system`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from compaction_kit.canaries import Canary
from compaction_kit.probes import BehaviorProbe

from bench.dialects import Wire
from bench.facts import flat
from compaction import ChatLLM
from compaction.types import Message
from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.settings import Settings


def forwarded_text(wire: Wire, body: dict[str, Any]) -> str:
    """Everything the model reads in a forwarded body: its system text and every item's text."""
    parts: list[str] = []
    for key in ("instructions", "system"):
        head = body.get(key)
        if isinstance(head, str):
            parts.append(head)
        elif isinstance(head, list):
            parts += [
                b["text"] for b in head if isinstance(b, dict) and isinstance(b.get("text"), str)
            ]
    parts += [wire.shape.read(item).text for item in wire.items(body)]
    return flat("\n".join(parts))


class FakeApis:
    """The upstream: answers the agent's requests of `wire`, plays the summarizer (one of the
    bench's scripted ones, shown the last turn of the proxy's summary request; None: it fails),
    keeps the last request forwarded per session (the proxy's own calls name none)."""

    def __init__(self, wire: Wire, summarizer: ChatLLM | None) -> None:
        self.wire = wire
        self.summarizer = summarizer
        self.last: dict[str, dict[str, Any]] = {}
        self.summary_calls = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        session = request.headers.get("X-Session-Id", "")
        purpose = request.headers.get("X-Compaction-Purpose")
        if purpose not in ("summary", "memory"):
            self.last[session] = body
            return web.json_response(self.wire.answer("Done.", 10))
        self.summary_calls += 1
        llm = self.summarizer
        if llm is None:
            return web.json_response({"error": {"message": "summarizer down"}}, status=500)
        items = self.wire.items(body)
        shown = self.wire.shape.read(items[-1]).text if items else ""
        budget = body.get("max_tokens") or body.get("max_output_tokens") or 512
        asked: list[Message] = [{"role": "user", "content": shown}]
        text = await llm.complete(asked, purpose=purpose, max_tokens=int(budget))
        return web.json_response(self.wire.answer(text, 10))


Conversation = tuple[str, list[Message], list[Canary], dict[int, int]]
"""A session's name, its messages, its canaries, and the request that reached each growth mark."""


async def replay_over_http(
    conversations: list[Conversation],
    wire: Wire,
    summarizer: ChatLLM | None,
    window: int,
    count: Callable[[Canary, int, bool], None],
    target_ratio: float,
) -> int:
    """Each conversation's requests sent through a proxy in front of FakeApis; `count(canary,
    mark, survived)` for every canary at every growth mark. Returns the summarizer calls."""
    apis = FakeApis(wire, summarizer)
    upstream = web.Application(client_max_size=64 * 2**20)
    upstream.router.add_post(f"/v1/{wire.path}", apis.handle)
    upstream_runner, upstream_url = await serve_on_loopback(upstream)
    try:
        with tempfile.TemporaryDirectory() as memory:
            proxy_runner, proxy_url = await serve_on_loopback(
                create_app(proxy_settings(upstream_url, window, memory, target_ratio))
            )
            try:
                async with aiohttp.ClientSession() as client:
                    for conversation in conversations:
                        await _send(
                            client, f"{proxy_url}/v1/{wire.path}", conversation, wire, apis, count
                        )
            finally:
                await proxy_runner.cleanup()
    finally:
        await upstream_runner.cleanup()
    return apis.summary_calls


def proxy_settings(upstream_url: str, window: int, memory: str, target_ratio: float) -> Settings:
    return Settings.model_validate(
        {
            "upstream": {
                "base_url": f"{upstream_url}/v1",
                "anthropic_base_url": f"{upstream_url}/v1",
            },
            "models": {"default_context_window": window},
            "compaction": {"precompute_ratio": 0, "target_ratio": target_ratio},
            "memory": {"dir": memory},
            "state": {"backend": "memory"},
            "logging": {"level": "ERROR"},  # a failing summarizer ("none") is a warning each time
        }
    )


async def _send(
    client: aiohttp.ClientSession,
    url: str,
    conversation: Conversation,
    wire: Wire,
    apis: FakeApis,
    count: Callable[[Canary, int, bool], None],
) -> None:
    """The agent's requests of one conversation, each the history up to a user or tool message;
    the canaries probed in what the upstream received at each growth mark."""
    name, messages, canaries, reached = conversation
    probe = BehaviorProbe()
    marks = {end: mark for mark, end in reached.items()}
    headers = {"X-Session-Id": name, "Authorization": "Bearer canaries"}
    for end in (i + 1 for i, m in enumerate(messages) if m["role"] in ("user", "tool")):
        async with client.post(
            url, json=wire.body(messages[:end], None), headers=headers
        ) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"{name}: the proxy answered {response.status}")
        if end in marks:
            text = forwarded_text(wire, apis.last[name])
            for canary in canaries:
                count(canary, marks[end], probe.probe(canary, text).survived)
