"""A scripted upstream for compaction tests: answers the proxy's own summary and memory calls
(told apart by `X-Compaction-Purpose`) and the agent's calls, each replaceable per test.

Every answer takes the shape of the API it was asked in (by path: chat completions, `responses`,
Anthropic `messages`), and every agent request to the Responses or Anthropic endpoint is checked
against that API's sequencing rules (bench.dialects); what the real API would refuse is collected
in `problems`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from bench.dialects import check_anthropic, check_responses
from compaction import HeuristicEstimator
from compaction.messages import ANTHROPIC, RESPONSES
from compaction.tokens import estimate_request
from tests.fakes.apis import anthropic_message, responses_object
from tests.fakes.upstream import FakeUpstream, Recorded, chat_completion

ESTIMATOR = HeuristicEstimator()
SUMMARY_TEXT = (
    "## Goals and requests\n- The user wants the failing tests fixed.\n"
    "## Decisions\n- Keep the standard library only.\n## Current state\n- Work continues."
)
MEMORY_TEXT = '[{"type": "decision", "content": "Keep the standard library only."}]'
PURPOSE = "X-Compaction-Purpose"


def tokens(messages: list[Any], tools: Any = None) -> int:
    """What the proxy's default estimator counts for a chat request."""
    return estimate_request(messages, tools, ESTIMATOR)


def body_tokens(path: str, payload: dict[str, Any]) -> int:
    """What the proxy's default estimator counts for a request body sent to `path`."""
    if path.endswith("/responses"):
        extras = [payload[k] for k in ("instructions", "tools") if payload.get(k) is not None]
        estimator = HeuristicEstimator(shape=RESPONSES)
        return estimate_request(payload["input"], extras or None, estimator)
    if path.endswith("/messages"):
        extras = [payload[k] for k in ("system", "tools") if payload.get(k) is not None]
        estimator = HeuristicEstimator(shape=ANTHROPIC)
        return estimate_request(payload["messages"], extras or None, estimator)
    return tokens(payload["messages"], payload.get("tools"))


def answer_body(path: str, text: str, prompt_tokens: int) -> dict[str, Any]:
    """`text` as the API at `path` answers, its usage saying `prompt_tokens`."""
    if path.endswith("/responses"):
        return responses_object(text, input_tokens=prompt_tokens)
    if path.endswith("/messages"):
        return anthropic_message(text, input_tokens=prompt_tokens)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens}
    return chat_completion(text, usage)


class Script:
    """Answers summary and memory calls from the proxy, and chat calls from the agent."""

    def __init__(self, upstream: FakeUpstream) -> None:
        self.upstream = upstream
        self.summary: Callable[[web.Request], Awaitable[web.StreamResponse]] = self.answer(
            SUMMARY_TEXT
        )
        self.memory = self.answer(MEMORY_TEXT)
        self.chat = self.counted("Done.")
        self.problems: list[str] = []
        self._seen: dict[str, Any] = {}
        upstream.reply(self._dispatch)

    @staticmethod
    def answer(
        text: str, usage: dict[str, int] | None = None
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def reply(request: web.Request) -> web.StreamResponse:
            if usage is not None or request.path.endswith("/chat/completions"):
                return web.json_response(chat_completion(text, usage))
            return web.json_response(answer_body(request.path, text, 10))

        return reply

    @staticmethod
    def counted(text: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """An answer whose usage reports what our estimator counts (a calibrated upstream)."""

        async def reply(request: web.Request) -> web.StreamResponse:
            try:
                prompt = body_tokens(request.path, orjson.loads(await request.read()))
            except (orjson.JSONDecodeError, TypeError, KeyError):
                prompt = 1  # not a compactable request: the proxy forwarded it untouched
            return web.json_response(answer_body(request.path, text, prompt))

        return reply

    async def _dispatch(self, request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        purpose = request.headers.get(PURPOSE)
        if purpose == "summary":
            return await self.summary(request)
        if purpose == "memory":
            return await self.memory(request)
        self._check(request.path, await request.read())
        return await self.chat(request)

    def _check(self, path: str, body: bytes) -> None:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if path.endswith("/responses"):
            self.problems += check_responses(payload, self._seen)
        elif path.endswith("/messages"):
            self.problems += check_anthropic(payload, self._seen)

    def calls(self, purpose: str | None) -> list[Recorded]:
        return [r for r in self.upstream.requests if r.headers.get(PURPOSE) == purpose]
