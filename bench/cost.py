"""What a conversation costs through the proxy versus sent direct, prompt caching modelled.

The corpus is replayed as growing requests (bench.replay), direct (as if the window were
unlimited) and through the proxy at each window, for each `compaction.summary_request` kind and
`compaction.strategy` the proxy has. A cache-modelling fake upstream bills every request it
receives, the proxy's own summary and memory calls included:

- chat and responses: OpenAI's automatic prefix caching. A prompt is its fixed part (tools,
  instructions) then its items; a prefix already seen within the TTL is read from the cache in
  whole blocks of `BLOCK_TOKENS`, the rest is billed as input.
- anthropic: `cache_control` breakpoints. Each breakpoint writes its prefix (billed at
  `WRITE_FACTOR` x input); a later prompt reads the longest written prefix found at one of its
  breakpoints or up to `LOOKBACK_BLOCKS` blocks before one. The replayed client marks its system
  prompt and its last turn, as Claude Code does.

Agent requests are billed the tokens of the corpus' next assistant turn as output, the same
direct and through the proxy; the fake summarizer answers at `SUMMARY_FILL` of the requested
`max_tokens` and the memory extraction with `MEMORY_ITEMS` items.

Two time models (`--pace`):
- `agent` (the default): every conversation at once, each at an agent's pace (`Pace`): a model
  turn takes `--turn-units`, the client's tool `--tool-units`, each of the proxy's own calls
  (summary, memory) `--own-units`, a unit lasting `--unit-s` real seconds and standing for
  `--unit-modelled-s` seconds of the cache's clock. The agent never waits for the proxy's
  background work; the proxy lives in real time. A run of the 41 conversations at 8k takes a few
  minutes.
- `sequential` (the former model, kept for comparison): one conversation after the other,
  `--turn-s` modelled seconds between two requests, the proxy living in that time scaled by
  `--time-scale` (default `TIME_SCALE`: a modelled second lasts 10 ms), a summarizer answering
  in `FIRST_TOKEN_S` plus its output at `OUTPUT_TOKENS_PER_S`. The proxy's own work is not
  scaled: its milliseconds of planning count as modelled seconds, so a smaller scale overstates
  how long a compaction takes against a turn. A proxied run of the conversations takes about 7
  minutes.

    .venv/bin/python -m bench.cost [--quick] [--windows 8000 32000] [--per-source 10]
                                   [--dialect chat|responses|anthropic] [--config config.yaml]
                                   [--set target_ratio=0.5 ...] [--pace agent|sequential]
                                   [--unit-s 0.1] [--turn-units 3] [--tool-units 1]
                                   [--own-units 6] [--unit-modelled-s 5] [--time-scale 0.01]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import re
import sys
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.corpus import CORPUS_ENV, corpus_dir, has_corpus, read_corpus
from bench.dialects import WIRES, Wire
from bench.replay import requests_of
from compaction import HeuristicEstimator
from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.settings import CompactionSection, Price, Settings, load_settings

SOURCES = (
    "swe_mini_gemini3pro.jsonl",
    "swe_mini_gemini3pro_toolcalls.jsonl",
    "swe_gym_openhands.jsonl",
    "tau_bench_airline_gpt4o.jsonl",
    "locomo10.jsonl",
)
QUICK_SOURCES = SOURCES[1:3]
"""`--quick`: one coding agent's conversation with tool calls, one OpenHands'."""
MODEL = "replay"
DEFAULT_PRICE = Price(input=2.50, cached_input=0.25, output=10.00)
BLOCK_TOKENS = 1024
"""OpenAI caches prompts of at least this many tokens, in whole blocks of it."""
TTL_S = 300.0
WRITE_FACTOR = 1.25
"""Anthropic bills a cache write at this multiple of the input price (5-minute cache)."""
LOOKBACK_BLOCKS = 20
MIN_CACHED_TOKENS = 1024
SUMMARY_FILL = 0.6
MEMORY_ITEMS = 8
TIME_SCALE = 0.01
"""Real seconds per modelled second, for the proxy (its own time adds to the modelled time)."""
FIRST_TOKEN_S = 1.0
OUTPUT_TOKENS_PER_S = 50.0
"""A summarizer's modelled speed: a slow model's (a quicker one is prepared for later)."""
OUTPUT_HEADER = "X-Bench-Output-Tokens"
CREDENTIAL_PREFIX = "replay-"
"""The paced replay's credentials: `Bearer replay-<conversation>`."""
PURPOSE = "X-Compaction-Purpose"


# ------------------------------------------------------------------ billing


@dataclass
class Bill:
    """What a set of requests cost, and the tokens behind it."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    written_tokens: int = 0
    output_tokens: int = 0
    dollars: float = 0.0

    def add(self, other: Bill) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.written_tokens += other.written_tokens
        self.output_tokens += other.output_tokens
        self.dollars += other.dollars

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _chain(previous: bytes, unit: Any) -> bytes:
    return hashlib.blake2b(previous + orjson.dumps(unit), digest_size=16).digest()


class PromptCache:
    """One provider's prompt cache, shared by every request it bills (as a provider's is by an
    organisation's requests), on a modelled clock."""

    def __init__(self, wire: Wire, price: Price) -> None:
        self.wire = wire
        self.price = price
        self.estimator = HeuristicEstimator(shape=wire.shape)
        self._expiry: dict[bytes, float] = {}

    def bill(self, body: dict[str, Any], output_tokens: int, now: float) -> Bill:
        units = list(self._units(body))
        tokens = [self._tokens(unit) for unit, _ in units]
        prompt = sum(tokens)
        if self.wire.name == "anthropic":
            cached, written = self._breakpoints(units, tokens, now)
        else:
            cached, written = self._prefix(units, tokens, now), 0
        price = self.price
        dollars = (
            (prompt - cached - written) * price.input
            + cached * price.cached_input
            + written * price.input * WRITE_FACTOR
            + output_tokens * price.output
        ) / 1e6
        return Bill(1, prompt, cached, written, output_tokens, dollars)

    def _tokens(self, unit: Any) -> int:
        """A unit's tokens as the proxy counts them: a message (a block in its turn), or the
        fields besides the list by their JSON size."""
        if isinstance(unit, dict) and "block" in unit:
            return self.estimator.count_message({"role": unit["role"], "content": [unit["block"]]})
        if isinstance(unit, dict) and ("role" in unit or "type" in unit):
            return self.estimator.count_message(unit)
        return self.estimator.count_tools(unit)

    def _units(self, body: dict[str, Any]) -> Iterator[tuple[Any, bool]]:
        """The prompt in the order the provider reads it, one unit a block (anthropic) or a
        message, each with whether it carries a cache breakpoint."""
        listed = self.wire.listed
        if self.wire.name != "anthropic":
            yield {k: v for k, v in sorted(body.items()) if k in self.wire.extras}, False
            yield from ((item, False) for item in body[listed])
            return
        # A breakpoint marks a block; it is no part of what the cache compares.
        for tool in body.get("tools") or []:
            yield _unmarked(tool), _marked(tool)
        system = body.get("system")
        for block in [system] if isinstance(system, str) else system or []:
            yield _unmarked(block), _marked(block)
        for message in body[listed]:
            content = message.get("content")
            blocks = [content] if isinstance(content, str) else content or []
            for block in blocks:
                yield {"role": message.get("role"), "block": _unmarked(block)}, _marked(block)

    def _prefix(self, units: list[tuple[Any, bool]], tokens: list[int], now: float) -> int:
        """OpenAI: the longest prefix seen within the TTL, in whole blocks; every prefix of
        this prompt is (re)written."""
        digest, total, common, alive = b"", 0, 0, True
        for (unit, _), count in zip(units, tokens, strict=True):
            digest = _chain(digest, unit)
            total += count
            if alive and self._expiry.get(digest, -1.0) >= now:
                common = total
            else:
                alive = False
            self._expiry[digest] = now + TTL_S
        if total < BLOCK_TOKENS:
            return 0
        return common // BLOCK_TOKENS * BLOCK_TOKENS

    def _breakpoints(
        self, units: list[tuple[Any, bool]], tokens: list[int], now: float
    ) -> tuple[int, int]:
        """Anthropic: the longest prefix written at a breakpoint found from one of this
        prompt's breakpoints (or up to LOOKBACK_BLOCKS before it) is read; every breakpoint
        past it writes."""
        digests: list[bytes] = []
        totals: list[int] = []
        digest, total = b"", 0
        for (unit, _), count in zip(units, tokens, strict=True):
            digest = _chain(digest, unit)
            total += count
            digests.append(digest)
            totals.append(total)
        marks = [i for i, (_, marked) in enumerate(units) if marked]
        cached = 0
        for mark in marks:
            for i in range(mark, max(-1, mark - LOOKBACK_BLOCKS), -1):
                if self._expiry.get(digests[i], -1.0) >= now:
                    cached = max(cached, totals[i])
                    break
        written = 0
        for mark in marks:
            if totals[mark] >= MIN_CACHED_TOKENS:
                self._expiry[digests[mark]] = now + TTL_S
                written = max(written, totals[mark] - cached)
        return cached, max(0, written)


def _marked(block: Any) -> bool:
    return isinstance(block, dict) and "cache_control" in block


def _unmarked(block: Any) -> Any:
    if not _marked(block):
        return block
    return {key: value for key, value in block.items() if key != "cache_control"}


def mark_last_turn(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic body whose last turn's last block carries a breakpoint (as Claude Code marks
    it), the turn copied, never edited in place."""
    turns = body["messages"]
    if not turns:
        return body
    last = dict(turns[-1])
    content = last.get("content")
    blocks: list[Any] = (
        [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    )
    if blocks:
        blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    last["content"] = blocks
    return {**body, "messages": [*turns[:-1], last]}


# ------------------------------------------------------------------ the fake upstream


@dataclass
class Ledger:
    """The fake upstream's bills by conversation and purpose ("agent", "summary", "memory")."""

    bills: dict[tuple[str, str], Bill] = field(default_factory=lambda: defaultdict(Bill))
    statuses: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


class CostUpstream:
    """Bills each request on the modelled cache at `now(conversation)`; answers summary and
    memory calls with a text of realistic length after `own_delay(output_tokens)` real seconds,
    agent requests with a short reply after `agent_delay` real seconds (the model's turn).

    A request is the conversation named by its credential when `by_credential` (the paced
    replay gives each conversation its own, so the proxy's own calls, which carry it, are told
    apart while all run at once), else by `X-Session-Id`, else the conversation whose request
    came last (one at a time, the proxy's own call is made for it)."""

    def __init__(
        self,
        wire: Wire,
        cache: PromptCache,
        ledger: Ledger,
        *,
        now: Callable[[str], float],
        own_delay: Callable[[int], float],
        agent_delay: float = 0.0,
        by_credential: bool = False,
    ) -> None:
        self.wire, self.cache, self.ledger = wire, cache, ledger
        self.now, self.own_delay, self.agent_delay = now, own_delay, agent_delay
        self.by_credential = by_credential
        self.latest = ""

    def conversation_of(self, request: web.Request) -> str:
        if self.by_credential:
            credential = request.headers.get("Authorization", "")
            return credential.removeprefix(f"Bearer {CREDENTIAL_PREFIX}")
        return request.headers.get("X-Session-Id", self.latest)

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        purpose = request.headers.get(PURPOSE, "agent")
        conversation = self.conversation_of(request)
        if purpose == "agent":
            self.latest = conversation
            text = "ok"
            output = int(request.headers.get(OUTPUT_HEADER, "1"))
            bill = self._bill(conversation, purpose, body, output)
            await asyncio.sleep(self.agent_delay)
        else:  # billed when answered, as the sequential model always did
            text = answer_for(purpose, body, self.cache.estimator)
            output = self.cache.estimator.count_text(text)
            await asyncio.sleep(self.own_delay(output))
            bill = self._bill(conversation, purpose, body, output)
        return web.json_response(self.wire.answer(text, bill.prompt_tokens))

    def _bill(self, conversation: str, purpose: str, body: dict[str, Any], output: int) -> Bill:
        bill = self.cache.bill(body, output, self.now(conversation))
        self.ledger.bills[conversation, purpose].add(bill)
        return bill


def answer_for(purpose: str, body: dict[str, Any], estimator: HeuristicEstimator) -> str:
    """A summarizer's answer: a summary filling SUMMARY_FILL of the length its prompt states,
    memory items, or both when one call asks for both."""
    text = orjson.dumps(body).decode()
    memory = orjson.dumps(
        [
            {"type": "fact", "content": f"Replayed fact number {i} of this conversation"}
            for i in range(MEMORY_ITEMS)
        ]
    ).decode()
    if purpose == "memory":
        return memory
    stated = _STATED.search(text)
    target = int(int(stated.group(1)) * SUMMARY_FILL) if stated else 300
    lines = ["## Goals and requests", "- continue the replayed task"]
    while estimator.count_text("\n".join(lines)) < target:
        lines.append(f"- step {len(lines)}: the agent read a file and ran the tests again")
    summary = "\n".join(lines)
    if "<memory>" in text:
        return f"<summary>\n{summary}\n</summary>\n<memory>\n{memory}\n</memory>"
    return summary


_STATED = re.compile(r"[Aa]t most (\d+) tokens")


# ------------------------------------------------------------------ replaying


@dataclass(frozen=True)
class Turn:
    body: dict[str, Any]
    output_tokens: int


def conversations_of(name: str, count: int) -> list[dict[str, Any]]:
    """Up to `count` distinct conversations spread over the file's length ranking."""
    rows = sorted(read_corpus(corpus_dir() / name), key=lambda row: len(row["messages"]))
    rows = rows[: max(1, int(len(rows) * 0.9))]
    step = max(1, len(rows) // (count + 1))
    picked: dict[str, dict[str, Any]] = {}
    for i in range(count):
        row = rows[min(len(rows) - 1, step * (i + 1))]
        picked.setdefault(row["id"], row)
    return list(picked.values())


def turns_of(wire: Wire, conversation: dict[str, Any], estimator: HeuristicEstimator) -> list[Turn]:
    messages = conversation["messages"]
    tools = conversation.get("tools") or None
    turns = []
    for prefix in requests_of(messages):
        body = wire.body(prefix, tools)
        body["model"] = MODEL
        if wire.name == "anthropic":
            body = mark_last_turn(body)
        following = messages[len(prefix)] if len(prefix) < len(messages) else None
        output = estimator.count_message(following) if following is not None else 1
        turns.append(Turn(body, output))
    return turns


def session_of(conversation: dict[str, Any]) -> str:
    return str(conversation["id"]).replace("/", "_")[:100]


@dataclass(frozen=True)
class Pace:
    """An agent's pace, in units: a model turn, the client's tool between two requests, one of
    the proxy's own calls (a summary writes about four times an agent reply's tokens). A unit
    lasts `unit_s` real seconds and stands for `unit_modelled_s` seconds of the prompt cache's
    clock (5: a coding turn of 15 s, a summary of 30 s, the 5-minute TTL 60 units)."""

    unit_s: float = 0.1
    turn_units: float = 3.0
    tool_units: float = 1.0
    own_units: float = 6.0
    unit_modelled_s: float = 5.0

    @property
    def step_units(self) -> float:
        """From one request of a conversation to its next, when nothing waits."""
        return self.turn_units + self.tool_units


def direct(
    wire: Wire, price: Price, picked: dict[str, list[dict[str, Any]]], turn_s: float
) -> Ledger:
    """Every request as sent, billed on a cache of its own (the unlimited window), one
    conversation after the other, `turn_s` modelled seconds apart."""
    ledger = Ledger()
    cache = PromptCache(wire, price)
    clock = 0.0
    for conversations in picked.values():
        for conversation in conversations:
            session = session_of(conversation)
            for turn in turns_of(wire, conversation, cache.estimator):
                clock += turn_s
                ledger.bills[session, "agent"].add(cache.bill(turn.body, turn.output_tokens, clock))
    return ledger


def direct_paced(
    wire: Wire, price: Price, picked: dict[str, list[dict[str, Any]]], pace: Pace
) -> Ledger:
    """Every request as sent, every conversation at once at `pace` (its k-th request k steps
    after its start), billed on one cache in the order they arrive."""
    ledger = Ledger()
    cache = PromptCache(wire, price)
    step_s = pace.step_units * pace.unit_modelled_s
    arrivals: list[tuple[float, int, str, Turn]] = []
    order = 0
    for conversations in picked.values():
        for conversation in conversations:
            session = session_of(conversation)
            for k, turn in enumerate(turns_of(wire, conversation, cache.estimator)):
                arrivals.append((k * step_s, order, session, turn))
                order += 1
    for at, _, session, turn in sorted(arrivals, key=lambda arrival: arrival[:2]):
        ledger.bills[session, "agent"].add(cache.bill(turn.body, turn.output_tokens, at))
    return ledger


@contextlib.asynccontextmanager
async def serving(
    wire: Wire, upstream: CostUpstream, window: int, compaction: dict[str, Any]
) -> AsyncIterator[str]:
    """The fake upstream and a real proxy at `window` with `compaction` settings in front of
    it, on loopback: yields the proxy's URL."""
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
                "models": {"default_context_window": window, "discover": False},
                "compaction": {"workers": 0, **compaction},
                "memory": {"dir": memory},
                "state": {"backend": "memory"},
            }
        )
        proxy_runner, proxy_url = await serve_on_loopback(create_app(settings))
        try:
            yield proxy_url
        finally:
            await proxy_runner.cleanup()
            await upstream_runner.cleanup()


async def through_proxy(
    wire: Wire,
    price: Price,
    picked: dict[str, list[dict[str, Any]]],
    window: int,
    compaction: dict[str, Any],
    turn_s: float,
    time_scale: float = TIME_SCALE,
) -> Ledger:
    """Every request through a proxy at `window` with `compaction` settings, one conversation
    after the other, the proxy's background work given time between turns."""
    ledger = Ledger()
    cache = PromptCache(wire, price)
    clock: dict[str, float] = {}
    upstream = CostUpstream(
        wire,
        cache,
        ledger,
        now=lambda conversation: clock.get(conversation, 0.0),
        own_delay=lambda output: (FIRST_TOKEN_S + output / OUTPUT_TOKENS_PER_S) * time_scale,
    )
    async with serving(wire, upstream, window, compaction) as proxy_url:
        modelled = 0.0
        async with aiohttp.ClientSession() as client:
            for conversations in picked.values():
                for conversation in conversations:
                    session = session_of(conversation)
                    for turn in turns_of(wire, conversation, cache.estimator):
                        modelled += turn_s
                        clock[session] = modelled
                        status = await _send(client, proxy_url, wire, session, turn)
                        ledger.statuses[session].add(status)
                        await _settle(turn_s * time_scale)
                    await _settle(0.2)
    return ledger


async def through_proxy_paced(
    wire: Wire,
    price: Price,
    picked: dict[str, list[dict[str, Any]]],
    window: int,
    compaction: dict[str, Any],
    pace: Pace,
) -> Ledger:
    """Every conversation through one proxy at once, each at `pace`: its next request a tool's
    time after the answer to its last. The cache's clock is real time in modelled units."""
    ledger = Ledger()
    cache = PromptCache(wire, price)
    loop = asyncio.get_running_loop()
    started = loop.time()
    upstream = CostUpstream(
        wire,
        cache,
        ledger,
        now=lambda _: (loop.time() - started) / pace.unit_s * pace.unit_modelled_s,
        own_delay=lambda _: pace.own_units * pace.unit_s,
        agent_delay=pace.turn_units * pace.unit_s,
        by_credential=True,
    )

    async def replay(client: aiohttp.ClientSession, proxy_url: str, conversation: Any) -> None:
        session = session_of(conversation)
        credential = f"Bearer {CREDENTIAL_PREFIX}{session}"
        for turn in turns_of(wire, conversation, cache.estimator):
            status = await _send(client, proxy_url, wire, session, turn, credential)
            ledger.statuses[session].add(status)
            await asyncio.sleep(pace.tool_units * pace.unit_s)

    async with serving(wire, upstream, window, compaction) as proxy_url:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as client:
            everyone = [c for conversations in picked.values() for c in conversations]
            await asyncio.gather(*(replay(client, proxy_url, c) for c in everyone))
        await asyncio.sleep(pace.own_units * pace.unit_s)  # the last own calls are billed
    return ledger


async def _send(
    client: aiohttp.ClientSession,
    proxy_url: str,
    wire: Wire,
    session: str,
    turn: Turn,
    credential: str = "Bearer replay",
) -> str:
    headers = {
        "X-Session-Id": session,
        "Authorization": credential,
        OUTPUT_HEADER: str(turn.output_tokens),
    }
    async with client.post(f"{proxy_url}/v1/{wire.path}", json=turn.body, headers=headers) as r:
        await r.read()
        return r.headers.get("x-compaction-status", "?")


async def _settle(seconds: float) -> None:
    """Let the proxy's background work (a compaction prepared ahead) reach the upstream before
    the next turn, as it would in the seconds an agent takes."""
    await asyncio.sleep(seconds)


# ------------------------------------------------------------------ reporting


@dataclass
class Figures:
    """One source's (or a total's) direct and proxied bills."""

    direct: Bill = field(default_factory=Bill)
    agent: Bill = field(default_factory=Bill)
    own: Bill = field(default_factory=Bill)
    conversations: int = 0

    @property
    def proxied(self) -> float:
        return self.agent.dollars + self.own.dollars

    @property
    def ratio(self) -> float:
        return self.proxied / self.direct.dollars if self.direct.dollars else 0.0

    @property
    def own_share(self) -> float:
        return self.own.dollars / self.proxied if self.proxied else 0.0

    def add(self, other: Figures) -> None:
        self.direct.add(other.direct)
        self.agent.add(other.agent)
        self.own.add(other.own)
        self.conversations += other.conversations


@dataclass
class Outcome:
    """A proxied run's figures: by source, and in total for the conversations that compacted
    and for those that never did."""

    by_source: dict[str, Figures]
    compacting: Figures
    quiet: Figures


def tally(
    picked: dict[str, list[dict[str, Any]]], direct_ledger: Ledger, proxied: Ledger
) -> Outcome:
    by_source: dict[str, Figures] = {}
    compacting, quiet = Figures(), Figures()
    for name, conversations in picked.items():
        figures = by_source[name] = Figures()
        for conversation in conversations:
            session = session_of(conversation)
            one = Figures(conversations=1)
            one.direct.add(direct_ledger.bills[session, "agent"])
            one.agent.add(proxied.bills[session, "agent"])
            one.own.add(proxied.bills[session, "summary"])
            one.own.add(proxied.bills[session, "memory"])
            figures.add(one)
            compacted = proxied.statuses[session] & {"applied", "reused"}
            (compacting if compacted else quiet).add(one)
    return Outcome(by_source, compacting, quiet)


def print_outcome(title: str, outcome: Outcome) -> None:
    print(f"\n{title}")
    print(
        f"  {'source':<36}{'convs':>6}{'direct $':>10}{'proxy $':>10}{'ratio':>7}"
        f"{'own $':>9}{'own %':>7}{'own calls':>10}{'hit direct':>11}{'hit proxy':>10}"
        f"{'fwd/orig tokens':>17}{'own hit':>9}{'own out/call':>13}"
    )
    rows = [*outcome.by_source.items(), ("compacting conversations", outcome.compacting)]
    rows.append(("never-compacting conversations", outcome.quiet))
    for name, f in rows:
        forwarded = f.agent.prompt_tokens / f.direct.prompt_tokens if f.direct.prompt_tokens else 0
        print(
            f"  {name[:35]:<36}{f.conversations:>6}{f.direct.dollars:>10.4f}{f.proxied:>10.4f}"
            f"{f.ratio:>7.3f}{f.own.dollars:>9.4f}{100 * f.own_share:>6.1f}%{f.own.requests:>10}"
            f"{100 * f.direct.hit_rate:>10.1f}%{100 * f.agent.hit_rate:>9.1f}%"
            f"{forwarded:>17.3f}{100 * f.own.hit_rate:>8.1f}%"
            f"{f.own.output_tokens / f.own.requests if f.own.requests else 0:>13.0f}"
        )


def variants(quick: bool, fixed: dict[str, Any]) -> list[dict[str, Any]]:
    """The compaction settings compared: each summary request kind and, where the proxy has
    them, each strategy; `fixed` (from --set) in all, and not varied."""
    fields = CompactionSection.model_fields
    kinds = ["cached", "standalone"] if "summary_request" in fields else [None]
    strategies = ["summary", "selective", "hybrid"] if "strategy" in fields else [None]
    if quick:
        kinds, strategies = kinds[:1], strategies[-1:]
    if "summary_request" in fixed:
        kinds = [None]
    if "strategy" in fixed:
        strategies = [None]
    found = []
    for strategy in strategies:
        for kind in kinds:
            options: dict[str, Any] = dict(fixed)
            if strategy is not None:
                options["strategy"] = strategy
            if kind is not None:
                options["summary_request"] = kind
            found.append(options)
    return found


def price_of(config: str | None) -> Price:
    if config is None:
        return DEFAULT_PRICE
    models = load_settings(config, {}).models
    return models.prices[MODEL] if MODEL in models.prices else models.price_for(MODEL)


def pace_of(args: argparse.Namespace) -> Pace | None:
    """The agent pace the arguments ask for; None: the sequential model."""
    if args.pace != "agent":
        return None
    return Pace(
        unit_s=args.unit_s,
        turn_units=args.turn_units,
        tool_units=args.tool_units,
        own_units=args.own_units,
        unit_modelled_s=args.unit_modelled_s,
    )


def describe_time(args: argparse.Namespace, pace: Pace | None) -> str:
    if pace is None:
        return f"one conversation at a time, {args.turn_s:g} s between turns"
    return (
        f"all conversations at once; a model turn {pace.turn_units:g} units, a tool "
        f"{pace.tool_units:g}, the proxy's own calls {pace.own_units:g}; a unit "
        f"{pace.unit_s:g} s real, {pace.unit_modelled_s:g} s of the cache's clock"
    )


async def run(args: argparse.Namespace) -> list[tuple[str, Outcome]]:
    wire = WIRES[args.dialect]
    price = price_of(args.config)
    sources = QUICK_SOURCES if args.quick else tuple(args.sources or SOURCES)
    per_source = 1 if args.quick else args.per_source
    picked = {name: conversations_of(name, per_source) for name in sources}
    windows = args.windows[:1] if args.quick else args.windows
    pace = pace_of(args)
    print(
        f"prices per million tokens: input ${price.input:.2f}, cached input "
        f"${price.cached_input:.2f}, output ${price.output:.2f}"
        + (f", cache write {WRITE_FACTOR}x input" if wire.name == "anthropic" else "")
    )
    print(
        f"dialect {wire.name}; cache: "
        + (
            f"breakpoints, lookback {LOOKBACK_BLOCKS} blocks"
            if wire.name == "anthropic"
            else f"prefix in {BLOCK_TOKENS}-token blocks"
        )
        + f", TTL {TTL_S:.0f} s; {describe_time(args, pace)}; "
        f"{sum(map(len, picked.values()))} conversations"
    )
    if pace is None:
        direct_ledger = direct(wire, price, picked, args.turn_s)
    else:
        direct_ledger = direct_paced(wire, price, picked, pace)
    outcomes = []
    for window in windows:
        for options in variants(args.quick, dict(args.set)):
            if pace is None:
                proxied = await through_proxy(
                    wire, price, picked, window, options, args.turn_s, args.time_scale
                )
            else:
                proxied = await through_proxy_paced(wire, price, picked, window, options, pace)
            title = f"window {window}, " + (
                ", ".join(f"{k} {v}" for k, v in options.items()) or "defaults"
            )
            outcome = tally(picked, direct_ledger, proxied)
            print_outcome(title, outcome)
            outcomes.append((title, outcome))
    return outcomes


def _setting(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    return key, orjson.loads(value) if value[:1].isdigit() else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 sources, 1 conversation, 8k")
    parser.add_argument("--windows", type=int, nargs="+", default=[8000, 32000])
    parser.add_argument("--per-source", type=int, default=10)
    parser.add_argument("--sources", nargs="*", choices=SOURCES, help="default: all")
    parser.add_argument(
        "--pace",
        choices=["agent", "sequential"],
        default="agent",
        help="agent: all conversations at once at an agent's pace; sequential: the former model",
    )
    default = Pace()
    parser.add_argument("--unit-s", type=float, default=default.unit_s, help="(agent)")
    parser.add_argument("--turn-units", type=float, default=default.turn_units, help="(agent)")
    parser.add_argument("--tool-units", type=float, default=default.tool_units, help="(agent)")
    parser.add_argument("--own-units", type=float, default=default.own_units, help="(agent)")
    parser.add_argument(
        "--unit-modelled-s", type=float, default=default.unit_modelled_s, help="(agent)"
    )
    parser.add_argument("--turn-s", type=float, default=20.0, help="(sequential)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=TIME_SCALE,
        help="(sequential) real seconds per modelled second for the proxy",
    )
    parser.add_argument("--dialect", choices=list(WIRES), default="chat")
    parser.add_argument("--config", help="a config.yaml whose models.prices names `replay`")
    parser.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a compaction setting for every run, e.g. target_ratio=0.5 (repeatable)",
    )
    args = parser.parse_args(argv)
    if not has_corpus():
        print(f"corpus not found at {corpus_dir()} (set {CORPUS_ENV})", file=sys.stderr)
        return 2
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
