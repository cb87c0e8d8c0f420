"""Replay the corpus as growing conversations through the proxy at a small window.

Each prefix of a trajectory that ends in a user or tool message is one request, as the agent sent
it. The stand-in upstream models a prompt cache (a request's cached tokens are its longest common
prefix with the session's previous request), checks every request it receives (valid tool pairing,
within the window) and answers summary calls after a delay, like a real summarizer. Printed per
source: requests, compactions, summarizer calls, forwarded vs original tokens, prefix-cache hit
rate through the proxy vs going direct, invalid requests, and the latency the proxy added to the
requests that compacted.

    .venv/bin/python -m bench.replay [--per-source 3] [--summary-delay 2.0] [--reply-delay 0.4]
                                     [--sources swe_mini swe_gym]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.corpus import CORPUS_ENV, corpus_dir, has_corpus, read_corpus
from compaction import HeuristicEstimator
from compaction.invariants import check_tool_pairing
from compaction.tokens import estimate_request
from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.settings import Settings

SOURCES = {
    "swe_mini_gemini3pro_toolcalls.jsonl": 8000,
    "swe_gym_openhands.jsonl": 8000,
    # Its system prompt and 14 tool schemas alone are ~3.5k tokens: 4k leaves nothing to keep.
    "tau_bench_airline_gpt4o.jsonl": 8000,
    "locomo10.jsonl": 8000,
}
ESTIMATOR = HeuristicEstimator()
# Added latency beyond which a request is counted as having waited for a summary.
_WAITED_S = 0.5


def pick(path: Path, count: int) -> list[dict[str, Any]]:
    """`count` conversations spread over the file's length ranking (longest excluded)."""
    rows = list(read_corpus(path))
    rows.sort(key=lambda row: len(row["messages"]))
    rows = rows[: max(1, int(len(rows) * 0.9))]
    step = max(1, len(rows) // (count + 1))
    return [rows[min(len(rows) - 1, step * (i + 1))] for i in range(count)]


def requests_of(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [
        messages[: i + 1]
        for i, m in enumerate(messages)
        if m.get("role") in ("user", "tool")
        and (i + 1 == len(messages) or messages[i + 1].get("role") != "tool")
    ]


def common_prefix_tokens(a: list[Any], b: list[Any]) -> int:
    total = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        total += ESTIMATOR.count_message(x)
    return total


@dataclass
class Tally:
    requests: int = 0
    summary_calls: int = 0
    memory_calls: int = 0
    invalid: int = 0
    over_window: int = 0
    over_window_giant_block: int = 0
    forwarded_tokens: int = 0
    cached_tokens: int = 0
    original_tokens: int = 0
    direct_cached_tokens: int = 0
    statuses: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    compaction_latency_s: list[float] = field(default_factory=list)
    plain_latency_s: list[float] = field(default_factory=list)


class Upstream:
    def __init__(self, tally: Tally, window: int, summary_delay: float, reply_delay: float) -> None:
        self.tally, self.window = tally, window
        self.summary_delay, self.reply_delay = summary_delay, reply_delay
        self.previous: dict[str, list[Any]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        payload = orjson.loads(await request.read())
        purpose = request.headers.get("X-Compaction-Purpose")
        if purpose == "summary":
            self.tally.summary_calls += 1
            await asyncio.sleep(self.summary_delay)
            return _answer(
                "## Goals and requests\n- continue the task\n## Current state\n- in progress"
            )
        if purpose == "memory":
            self.tally.memory_calls += 1
            await asyncio.sleep(self.summary_delay / 2)
            return _answer("[]")
        messages = payload["messages"]
        tokens = estimate_request(messages, payload.get("tools"), ESTIMATOR)
        session = request.headers["X-Session-Id"]
        cached = common_prefix_tokens(self.previous.get(session, []), messages)
        self.previous[session] = messages
        self.tally.forwarded_tokens += tokens
        self.tally.cached_tokens += cached
        self.tally.invalid += bool(check_tool_pairing(messages))
        if tokens > self.window:
            self.tally.over_window += 1
            # A single message that alone leaves no room: kept whole by contract, never edited.
            self.tally.over_window_giant_block += (
                max(map(ESTIMATOR.count_message, messages)) > 0.6 * self.window
            )
        await asyncio.sleep(self.reply_delay)
        return _answer("ok", prompt_tokens=tokens)


def _answer(text: str, prompt_tokens: int = 10) -> web.Response:
    return web.json_response(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1},
        }
    )


async def replay_one(
    client: aiohttp.ClientSession, url: str, conversation: dict[str, Any], tally: Tally
) -> None:
    session = conversation["id"].replace("/", "_")[:100]
    previous: list[Any] = []
    for prefix in requests_of(conversation["messages"]):
        body = {"model": "replay", "messages": prefix}
        if conversation.get("tools"):
            body["tools"] = conversation["tools"]
        tally.original_tokens += estimate_request(prefix, body.get("tools"), ESTIMATOR)
        tally.direct_cached_tokens += common_prefix_tokens(previous, prefix)
        previous = prefix
        started = time.perf_counter()
        async with client.post(
            url, json=body, headers={"X-Session-Id": session, "Authorization": "Bearer replay"}
        ) as response:
            await response.read()
            status = response.headers.get("x-compaction-status", "?")
        elapsed = time.perf_counter() - started
        tally.requests += 1
        tally.statuses[status] += 1
        (tally.compaction_latency_s if status == "applied" else tally.plain_latency_s).append(
            elapsed
        )


async def replay_source(name: str, window: int, args: argparse.Namespace) -> Tally:
    tally = Tally()
    upstream = Upstream(tally, window, args.summary_delay, args.reply_delay)
    upstream_app = web.Application(client_max_size=64 * 2**20)
    upstream_app.router.add_post("/v1/chat/completions", upstream.handle)
    upstream_runner, upstream_url = await serve_on_loopback(upstream_app)
    with tempfile.TemporaryDirectory() as memory:
        settings = Settings.model_validate(
            {
                "upstream": {"base_url": f"{upstream_url}/v1"},
                "models": {"default_context_window": window},
                "compaction": {"summary_timeout_s": args.summary_delay * 5},
                "memory": {"dir": memory},
                "state": {"backend": "memory"},
            }
        )
        proxy_runner, proxy_url = await serve_on_loopback(create_app(settings))
        conversations = pick(corpus_dir() / name, args.per_source)
        try:
            async with aiohttp.ClientSession() as client:
                await asyncio.gather(
                    *(
                        replay_one(client, f"{proxy_url}/v1/chat/completions", c, tally)
                        for c in conversations
                    )
                )
        finally:
            await proxy_runner.cleanup()
            await upstream_runner.cleanup()
    return tally


def report(name: str, window: int, tally: Tally, reply_delay: float) -> None:
    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:5.1f}%" if whole else "    -"

    compactions = tally.statuses.get("applied", 0)
    added = [t - reply_delay for t in tally.compaction_latency_s]
    plain = [t - reply_delay for t in tally.plain_latency_s]
    print(f"\n{name}  (window {window} tokens)")
    print(f"  requests {tally.requests}   statuses {dict(tally.statuses)}")
    print(
        f"  summarizer calls {tally.summary_calls} (+{tally.memory_calls} memory)   "
        f"invalid requests {tally.invalid}   over the window {tally.over_window} "
        f"(of which one message alone > 60% of the window: {tally.over_window_giant_block})"
    )
    print(
        f"  forwarded tokens {tally.forwarded_tokens:,} vs original {tally.original_tokens:,} "
        f"({pct(tally.forwarded_tokens, tally.original_tokens)})"
    )
    print(
        f"  prefix-cache hit rate via proxy {pct(tally.cached_tokens, tally.forwarded_tokens)}"
        f"   direct {pct(tally.direct_cached_tokens, tally.original_tokens)}"
    )
    if added:
        # "applied" = a compaction new to the conversation went out; most were prepared in the
        # background, so only some of those requests waited for a summary.
        waited = [t for t in added if t > _WAITED_S]
        print(
            f"  requests carrying a new compaction: {compactions}; added latency median "
            f"{statistics.median(added) * 1000:.0f} ms, max {max(added) * 1000:.0f} ms; "
            f"{len(waited)} waited for a summary (> {_WAITED_S:.1f} s added)"
        )
    if plain:
        print(f"  other requests: added latency median {statistics.median(plain) * 1000:.1f} ms")


async def main_async(args: argparse.Namespace) -> int:
    if not has_corpus():
        print(f"corpus not found at {corpus_dir()} (set {CORPUS_ENV})", file=sys.stderr)
        return 2
    print(
        f"summarizer delay {args.summary_delay}s, reply delay {args.reply_delay}s, "
        f"{args.per_source} conversations per source"
    )
    for name, window in SOURCES.items():
        if args.sources and not any(name.startswith(prefix) for prefix in args.sources):
            continue
        tally = await replay_source(name, window, args)
        report(name, window, tally, args.reply_delay)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-source", type=int, default=3)
    parser.add_argument("--summary-delay", type=float, default=2.0)
    parser.add_argument(
        "--reply-delay",
        type=float,
        default=0.4,
        help="the model's answer time (real agents: seconds)",
    )
    parser.add_argument("--sources", nargs="*", help="file name prefixes to replay (default: all)")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
