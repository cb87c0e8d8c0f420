"""A scripted upstream for compaction tests: answers the proxy's own summary and memory calls
(told apart by `X-Compaction-Purpose`) and the agent's chat calls, each replaceable per test."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from compaction import HeuristicEstimator
from compaction.tokens import estimate_request
from tests.fakes.upstream import FakeUpstream, Recorded, chat_completion

ESTIMATOR = HeuristicEstimator()
SUMMARY_TEXT = (
    "## Goals and requests\n- The user wants the failing tests fixed.\n"
    "## Decisions\n- Keep the standard library only.\n## Current state\n- Work continues."
)
MEMORY_TEXT = '[{"type": "decision", "content": "Keep the standard library only."}]'
PURPOSE = "X-Compaction-Purpose"


def tokens(messages: list[Any], tools: Any = None) -> int:
    """What the proxy's default estimator counts for a request."""
    return estimate_request(messages, tools, ESTIMATOR)


class Script:
    """Answers summary and memory calls from the proxy, and chat calls from the agent."""

    def __init__(self, upstream: FakeUpstream) -> None:
        self.upstream = upstream
        self.summary: Callable[[web.Request], Awaitable[web.StreamResponse]] = self.answer(
            SUMMARY_TEXT
        )
        self.memory = self.answer(MEMORY_TEXT)
        self.chat = self.counted("Done.")
        upstream.reply(self._dispatch)

    @staticmethod
    def answer(
        text: str, usage: dict[str, int] | None = None
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def reply(request: web.Request) -> web.StreamResponse:
            return web.json_response(chat_completion(text, usage))

        return reply

    @staticmethod
    def counted(text: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A chat answer whose usage reports what our estimator counts (a calibrated upstream)."""

        async def reply(request: web.Request) -> web.StreamResponse:
            try:
                payload = orjson.loads(await request.read())
                prompt = tokens(payload["messages"], payload.get("tools"))
            except (orjson.JSONDecodeError, TypeError, KeyError):
                prompt = 1  # not a chat request: the proxy forwarded it untouched
            usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
            return web.json_response(chat_completion(text, usage))

        return reply

    async def _dispatch(self, request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        purpose = request.headers.get(PURPOSE)
        if purpose == "summary":
            return await self.summary(request)
        if purpose == "memory":
            return await self.memory(request)
        return await self.chat(request)

    def calls(self, purpose: str | None) -> list[Recorded]:
        return [r for r in self.upstream.requests if r.headers.get(PURPOSE) == purpose]
