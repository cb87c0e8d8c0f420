"""Replay the corpus as growing conversations through the proxy at a small window.

Each prefix of a trajectory that ends in a user or tool message is one request, as the agent sent
it. The stand-in upstream models a prompt cache (a request's cached tokens are its longest common
prefix with the session's previous request, plus its tools, instructions or system when they did
not change), checks every request it receives (valid tool pairing,
within the window) and answers summary calls after a delay, like a real summarizer. Printed per
source: requests, compactions, summarizer calls, forwarded vs original tokens, prefix-cache hit
rate through the proxy vs going direct, invalid requests, prefix breaks between compactions, and
the latency the proxy added to the requests that compacted.

`--dialect responses` / `anthropic` converts every request into that API's shape first
(bench.dialects: reasoning items, thinking blocks with signatures, tool blocks of that API) and
checks what the upstream receives against that API's rules; `--dialect all` runs the three.

    .venv/bin/python -m bench.replay [--per-source 3] [--summary-delay 2.0] [--reply-delay 0.4]
                                     [--sources swe_mini swe_gym] [--dialect chat|responses|anthropic|all]
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
from bench.dialects import WIRES, Wire
from compaction import SUMMARY_MARKER, HeuristicEstimator
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


def common_prefix_tokens(a: list[Any], b: list[Any], estimator: HeuristicEstimator) -> int:
    total = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        total += estimator.count_message(x)
    return total


def fixed_tokens(wire: Wire, body: dict[str, Any], last: dict[str, bytes], session: str) -> int:
    """The tokens of what precedes the list in the prompt (tools, instructions, system) when
    they are the same as in the session's previous request: a prompt cache holds them too."""
    fixed = {key: value for key, value in body.items() if key != wire.listed}
    text = orjson.dumps(fixed, option=orjson.OPT_SORT_KEYS)
    same = last.get(session) == text
    last[session] = text
    return wire.tokens({**body, wire.listed: []}) if same else 0


def summary_of(items: list[Any]) -> bytes | None:
    """The bytes of the item carrying the summary (it sits near the start), None if none."""
    for item in items[:4]:
        text = orjson.dumps(item)
        if SUMMARY_MARKER.encode() in text:
            return text
    return None


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
    prefix_breaks: int = 0
    """Requests whose list did not extend the previous one though the summary was the same."""
    summary_changes: int = 0
    statuses: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    compaction_latency_s: list[float] = field(default_factory=list)
    plain_latency_s: list[float] = field(default_factory=list)


class Upstream:
    def __init__(
        self, wire: Wire, tally: Tally, window: int, summary_delay: float, reply_delay: float
    ) -> None:
        self.wire, self.tally, self.window = wire, tally, window
        self.summary_delay, self.reply_delay = summary_delay, reply_delay
        self.estimator = wire.estimator()
        self.previous: dict[str, list[Any]] = {}
        self.fixed: dict[str, bytes] = {}
        self.seen: dict[str, dict[str, Any]] = defaultdict(dict)

    async def handle(self, request: web.Request) -> web.Response:
        payload = orjson.loads(await request.read())
        purpose = request.headers.get("X-Compaction-Purpose")
        if purpose == "summary":
            self.tally.summary_calls += 1
            await asyncio.sleep(self.summary_delay)
            return self._answer(
                "## Goals and requests\n- continue the task\n## Current state\n- in progress"
            )
        if purpose == "memory":
            self.tally.memory_calls += 1
            await asyncio.sleep(self.summary_delay / 2)
            return self._answer("[]")
        items = self.wire.items(payload)
        tokens = self.wire.tokens(payload)
        session = request.headers["X-Session-Id"]
        previous = self.previous.get(session, [])
        self._check_prefix(previous, items)
        self.previous[session] = items
        self.tally.forwarded_tokens += tokens
        self.tally.cached_tokens += common_prefix_tokens(previous, items, self.estimator)
        self.tally.cached_tokens += fixed_tokens(self.wire, payload, self.fixed, session)
        self.tally.invalid += bool(self.wire.check(payload, self.seen[session]))
        if tokens > self.window:
            self.tally.over_window += 1
            # A single message that alone leaves no room: kept whole by contract, never edited.
            self.tally.over_window_giant_block += (
                max(map(self.estimator.count_message, items)) > 0.6 * self.window
            )
        await asyncio.sleep(self.reply_delay)
        return self._answer("ok", prompt_tokens=tokens)

    def _check_prefix(self, previous: list[Any], items: list[Any]) -> None:
        """Between two compactions the forwarded list only grows: the previous one (its last
        turn aside, which Anthropic's shape may extend) is a prefix of this one, byte for byte."""
        if not previous:
            return
        if summary_of(previous) != summary_of(items):
            self.tally.summary_changes += 1
            return
        kept = previous[:-1]
        if [orjson.dumps(i) for i in items[: len(kept)]] != [orjson.dumps(i) for i in kept]:
            self.tally.prefix_breaks += 1

    def _answer(self, text: str, prompt_tokens: int = 10) -> web.Response:
        return web.json_response(self.wire.answer(text, prompt_tokens))


async def replay_one(
    client: aiohttp.ClientSession,
    url: str,
    wire: Wire,
    conversation: dict[str, Any],
    tally: Tally,
) -> None:
    session = conversation["id"].replace("/", "_")[:100]
    previous: list[Any] = []
    estimator = wire.estimator()
    fixed: dict[str, bytes] = {}
    for prefix in requests_of(conversation["messages"]):
        body = wire.body(prefix, conversation.get("tools") or None)
        items = wire.items(body)
        tally.original_tokens += wire.tokens(body)
        tally.direct_cached_tokens += common_prefix_tokens(previous, items, estimator)
        tally.direct_cached_tokens += fixed_tokens(wire, body, fixed, session)
        previous = items
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


async def replay_source(name: str, window: int, wire: Wire, args: argparse.Namespace) -> Tally:
    tally = Tally()
    upstream = Upstream(wire, tally, window, args.summary_delay, args.reply_delay)
    upstream_app = web.Application(client_max_size=64 * 2**20)
    upstream_app.router.add_post(f"/v1/{wire.path}", upstream.handle)
    upstream_runner, upstream_url = await serve_on_loopback(upstream_app)
    with tempfile.TemporaryDirectory() as memory:
        settings = Settings.model_validate(
            {
                "upstream": {
                    "base_url": f"{upstream_url}/v1",
                    "anthropic_base_url": f"{upstream_url}/v1",
                },
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
                        replay_one(client, f"{proxy_url}/v1/{wire.path}", wire, c, tally)
                        for c in conversations
                    )
                )
        finally:
            await proxy_runner.cleanup()
            await upstream_runner.cleanup()
    return tally


def report(name: str, window: int, wire: Wire, tally: Tally, reply_delay: float) -> None:
    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:5.1f}%" if whole else "    -"

    compactions = tally.statuses.get("applied", 0)
    added = [t - reply_delay for t in tally.compaction_latency_s]
    plain = [t - reply_delay for t in tally.plain_latency_s]
    print(f"\n{name}  ({wire.name}, window {window} tokens)")
    print(f"  requests {tally.requests}   statuses {dict(tally.statuses)}")
    print(
        f"  summarizer calls {tally.summary_calls} (+{tally.memory_calls} memory)   "
        f"invalid requests {tally.invalid}   over the window {tally.over_window} "
        f"(of which one message alone > 60% of the window: {tally.over_window_giant_block})"
    )
    print(
        f"  prefix breaks between compactions {tally.prefix_breaks}   "
        f"summary changes {tally.summary_changes}"
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
    dialects = list(WIRES) if args.dialect == "all" else [args.dialect]
    for dialect in dialects:
        wire = WIRES[dialect]
        for name, window in SOURCES.items():
            if args.sources and not any(name.startswith(prefix) for prefix in args.sources):
                continue
            tally = await replay_source(name, window, wire, args)
            report(name, window, wire, tally, args.reply_delay)
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
    parser.add_argument(
        "--dialect",
        choices=[*WIRES, "all"],
        default="chat",
        help="the API shape requests are sent in (default: chat)",
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
