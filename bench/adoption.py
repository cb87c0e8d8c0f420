"""Real agents' traffic shapes through the proxy: does any request wait on a summarizer?

    .venv/bin/python -m bench.adoption [--steps 120] [--summarizer-s 3] [--think-s 0.5]
        [--strategy summary]

The proxy runs through its CLI (default config but the windows, and `compaction.strategy` when
`--strategy` names one: `summary` asks the summarizer at every compaction) in its own process,
against a
scripted upstream on loopback in this one (tests.fakes: it answers the agent's turns after
`--think-s`, as a model takes its time, and summaries after `--summarizer-s`). Each shape is one
conversation growing by a tool round per request, sent one request at a time as an agent does:

- Claude Code: Anthropic Messages, a fixed head (system prompt and tools) of ~22k tokens,
  `max_tokens` 32k or 64k with thinking enabled at a budget one below it (as Claude Code sends
  it), windows 100k and 200k. The `max_tokens` rule fires before the ratio: at 68k of 100k for
  32k (the trigger moves, and preparing ahead must move with it).
- Codex: Responses, a ~10k head (instructions and tools), no `max_output_tokens`, a 128k window.

Printed per shape: requests, how many compacted (`applied`), how many waited on a summarizer
in steady state (compacted or reused with the proxy's own time at least half the summarizer's:
target 0), how many others took a second or more (`slow`: waiting on the worker pool),
the proxy's own time (`x-compaction-proxy-overhead-ms`) for the first request (a long body is
indexed in a worker, and the pool starts on its first job) and p50 / p99 / max for the others;
and the forwarded bodies the fake APIs found invalid (target 0). Then the proxy's own calls
(summaries, memory items) whose prompt plus `max_tokens` exceeds the model's window (target 0:
a real upstream refuses them, and the proxy falls back to a summary built by code).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.dialects import to_anthropic, to_responses
from bench.passthrough import free_port, spawn, stop, wait_ready
from tests import factories as f
from tests.fakes.script import PURPOSE, Script, body_tokens
from tests.fakes.upstream import FakeUpstream, Recorded

ROOT = Path(__file__).resolve().parents[1]
OVERHEAD = "x-compaction-proxy-overhead-ms"
STATUS = "x-compaction-status"
# A tool round's output: about 1.5k tokens of varied text.
_OUTPUT_CHARS = 6_000
_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "parser",
    "module",
    "config",
    "build",
    "test",
    "retry",
    "cache",
    "index",
]


@dataclass(frozen=True)
class Shape:
    name: str
    api: str  # "anthropic" or "responses"
    model: str
    window: int
    head_tokens: int
    max_tokens: int | None


SHAPES = [
    Shape("claude-code 100k, max_tokens 32k", "anthropic", "claude-100k", 100_000, 22_000, 32_000),
    Shape("claude-code 200k, max_tokens 32k", "anthropic", "claude-200k", 200_000, 22_000, 32_000),
    Shape("claude-code 200k, max_tokens 64k", "anthropic", "claude-200k", 200_000, 22_000, 64_000),
    Shape("codex 128k", "responses", "codex-128k", 128_000, 10_000, None),
]


@dataclass
class Figures:
    statuses: list[str]
    overheads_ms: list[float]

    def waited(self, summarizer_s: float) -> int:
        """Requests of the steady state compacted while they waited: the proxy's own time at
        least half the summarizer's."""
        pairs = zip(self.statuses[1:], self.overheads_ms[1:], strict=True)
        return sum(s != "none" and ms >= summarizer_s * 500 for s, ms in pairs)

    def slow(self) -> int:
        """Requests of the steady state sent as they came after a second or more in the proxy
        (on the worker pool: a long body is indexed there before it is decided)."""
        pairs = zip(self.statuses[1:], self.overheads_ms[1:], strict=True)
        return sum(s == "none" and ms >= 1000 for s, ms in pairs)


def prose(chars: int, seed: int) -> str:
    words = [_WORDS[(seed * 7 + i * i) % len(_WORDS)] + str((seed + i) % 97) for i in range(chars)]
    return " ".join(words)[:chars]


def head(shape: Shape) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The client's fixed head: a system prompt and tools of about `shape.head_tokens`."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": prose(2_000, i),
                "parameters": {"type": "object", "properties": {}},
            },
        }
        for i in range(8)
    ]
    system = prose(max(1_000, shape.head_tokens * 4 - 16_000), 1)
    return [f.system(system)], tools


def body_of(shape: Shape, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    if shape.api == "anthropic":
        body = to_anthropic(messages, tools)
        body["max_tokens"] = shape.max_tokens
        if shape.max_tokens is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": shape.max_tokens - 1}
    else:
        body = to_responses(messages, tools)
    body["model"] = shape.model
    return orjson.dumps(body)


async def converse(session: aiohttp.ClientSession, proxy: str, shape: Shape, steps: int) -> Figures:
    messages, tools = head(shape)
    path = "/v1/messages" if shape.api == "anthropic" else "/v1/responses"
    headers = {
        "Content-Type": "application/json",
        "Authorization": "Bearer sk-bench",
        "x-api-key": "sk-bench",
        "X-Session-Id": "".join(c if c.isalnum() else "-" for c in shape.name),
    }
    figures = Figures([], [])
    for step in range(steps):
        round_ = f.tool_round(step, blocks=1, output_chars=_OUTPUT_CHARS)
        for message in round_:
            if message.get("role") == "tool":
                message["content"] = prose(_OUTPUT_CHARS, step)
        messages += [*round_, f.user(f"Go on with step {step + 1}.")]
        async with session.post(
            proxy + path, data=body_of(shape, messages, tools), headers=headers
        ) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(
                    f"{shape.name}: HTTP {response.status}: {(await response.read())[:300]!r}"
                )
            figures.statuses.append(response.headers.get(STATUS, "?"))
            figures.overheads_ms.append(float(response.headers.get(OVERHEAD, "0")))
    return figures


def config(shapes: list[Shape], memory: str, strategy: str | None = None) -> str:
    windows = {s.model: s.window for s in shapes}
    settings: dict[str, Any] = {"models": {"context_windows": windows}, "memory": {"dir": memory}}
    if strategy is not None:
        settings["compaction"] = {"strategy": strategy}
    return orjson.dumps(settings).decode()


async def run(steps: int, summarizer_s: float, think_s: float, strategy: str | None) -> None:
    async with FakeUpstream() as upstream:
        script = Script(upstream)
        answer_summary, answer_turn = script.summary, script.chat

        async def slow_summary(request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(summarizer_s)
            return await answer_summary(request)

        async def thinking(request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(think_s)
            return await answer_turn(request)

        script.summary = slow_summary
        script.chat = thinking
        port = free_port()
        with tempfile.TemporaryDirectory() as scratch:
            settings = Path(scratch) / "config.yaml"  # JSON is YAML
            settings.write_text(config(SHAPES, str(Path(scratch) / "memory"), strategy))
            proxy = spawn(
                [
                    *("-m", "proxy", "--port", str(port), "--config", str(settings)),
                    *("--upstream", upstream.base_url),
                ],
                COMPACTION_PROXY__UPSTREAM__ANTHROPIC_BASE_URL=upstream.base_url,
            )
            url = f"http://127.0.0.1:{port}"
            try:
                await wait_ready(f"{url}/healthz")
                started = time.monotonic()
                async with aiohttp.ClientSession() as session:
                    results = await asyncio.gather(
                        *(converse(session, url, shape, steps) for shape in SHAPES)
                    )
                elapsed = time.monotonic() - started
            finally:
                stop([proxy])
        report(results, summarizer_s, think_s, elapsed, len(script.problems))
        own = [r for r in upstream.requests if r.headers.get(PURPOSE) is not None]
        over = over_window(own, {s.model: s.window for s in SHAPES})
        print(f"summary requests over window: {over} (of {len(own)} calls of the proxy's own)")


def report(
    results: list[Figures], summarizer_s: float, think_s: float, elapsed: float, invalid: int
) -> None:
    print(
        f"adoption: {summarizer_s:g} s summarizer, {think_s:g} s per model turn, "
        f"~{_OUTPUT_CHARS // 4} tokens per tool round, {elapsed:.0f} s; proxy time in ms"
    )
    print(
        f"{'shape':<34} {'reqs':>5} {'applied':>8} {'waited':>7} {'slow':>5} {'first':>8} {'p50':>7} "
        f"{'p99':>7} {'max':>8}"
    )
    for shape, figures in zip(SHAPES, results, strict=True):
        # The first request of each conversation meets the worker pool starting: apart.
        times = sorted(figures.overheads_ms[1:])
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        print(
            f"{shape.name:<34} {len(times) + 1:>5} {figures.statuses.count('applied'):>8} "
            f"{figures.waited(summarizer_s):>7} {figures.slow():>5} {figures.overheads_ms[0]:>8.1f} "
            f"{statistics.median(times):>7.1f} {p99:>7.1f} {times[-1]:>8.1f}"
        )
    print(f"forwarded bodies the fake APIs found invalid: {invalid}")


def over_window(calls: list[Recorded], windows: dict[str, int]) -> int:
    """The calls whose prompt (as the proxy estimates it) plus the `max_tokens` they ask exceed
    their model's window."""
    over = 0
    for call in calls:
        payload = call.json()
        window = windows.get(str(payload.get("model")))
        asked = payload.get("max_tokens") or payload.get("max_output_tokens") or 0
        over += window is not None and body_tokens(call.path, payload) + asked > window
    return over


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--summarizer-s", type=float, default=3.0)
    parser.add_argument("--think-s", type=float, default=0.5)
    parser.add_argument("--strategy", choices=("summary", "selective", "hybrid"), default=None)
    args = parser.parse_args()
    asyncio.run(run(args.steps, args.summarizer_s, args.think_s, args.strategy))


if __name__ == "__main__":
    main()
