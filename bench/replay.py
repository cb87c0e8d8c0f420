"""Replay the corpus as growing conversations through the proxy at a small window.

Each prefix of a trajectory that ends in a user or tool message is one request, as the agent sent
it. The stand-in upstream models a prompt cache (a request's cached tokens are its longest common
prefix with the session's previous request, plus its tools, instructions or system when they did
not change), checks every request it receives (valid tool pairing,
within the window) and answers summary calls after a delay, like a real summarizer. Printed per
source: requests, compactions, summarizer calls, forwarded vs original tokens, prefix-cache hit
rate through the proxy vs going direct, invalid requests, prefix breaks between compactions, and
the latency the proxy added to the requests that compacted.

`--shadow` replays each source twice, with `compaction.mode: on` and `shadow`, and proves shadow
mode: every request the upstream received in shadow is the client's, byte for byte, and the
sessions' records on /admin/sessions (less times, durations, and compaction ids, compared by
their order) are those of `on` for the same traffic. Any difference is printed and fails the run.
Both runs see the same traffic both ways and nothing in them depends on timing: the answers
report no usage (calibration would learn from the compacted bytes in one run and the client's in
the other), compactions are not prepared ahead (whether one was ready before the next request
came is a race between two runs), and the summarizer is always waited for.

`--dialect responses` / `anthropic` converts every request into that API's shape first
(bench.dialects: reasoning items, thinking blocks with signatures, tool blocks of that API) and
checks what the upstream receives against that API's rules; `--dialect all` runs the three.

    .venv/bin/python -m bench.replay [--per-source 3] [--summary-delay 2.0] [--reply-delay 0.4]
                                     [--sources swe_mini swe_gym] [--dialect chat|responses|anthropic|all]
                                     [--shadow]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
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
_ADMIN_TOKEN = "replay-admin"
# What a record says about when and how long, not what: left out when shadow is compared to on.
_TIMES = frozenset({"time", "duration_ms", "first_seen", "last_seen"})
# Ids drawn at random per compaction: compared by their order of appearance instead.
_IDS = frozenset({"id", "extends"})
# What tells the two runs apart by design: a record says which mode computed it.
_MODE = "mode"
# The runs of the shadow proof: each compaction on the request that reaches the trigger, which
# waits for it (see --shadow).
_PROOF = {"precompute_ratio": 0, "fit_ratio": None, "summary_timeout_s": 120}


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
    sent: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    """Per session, a digest of each request body as the client sent it, in order."""
    forwarded: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    """Per session, a digest of each request body the upstream received (summarizer calls
    aside), in order."""
    records: dict[str, Any] = field(default_factory=dict)
    """Per session, what /admin/sessions/{session} said once the replay was over."""


class Upstream:
    def __init__(
        self,
        wire: Wire,
        tally: Tally,
        window: int,
        summary_delay: float,
        reply_delay: float,
        usage: bool = True,
    ) -> None:
        """`usage`: whether answers report the prompt's tokens (the proxy calibrates on them)."""
        self.wire, self.tally, self.window = wire, tally, window
        self.summary_delay, self.reply_delay = summary_delay, reply_delay
        self.usage = usage
        self.estimator = wire.estimator()
        self.previous: dict[str, list[Any]] = {}
        self.fixed: dict[str, bytes] = {}
        self.seen: dict[str, dict[str, Any]] = defaultdict(dict)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        payload = orjson.loads(raw)
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
        self.tally.forwarded[session].append(_digest(raw))
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
        return self._answer("ok", prompt_tokens=tokens if self.usage else None)

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

    def _answer(self, text: str, prompt_tokens: int | None = 10) -> web.Response:
        answer = self.wire.answer(text, prompt_tokens or 0)
        if prompt_tokens is None:
            del answer["usage"]
        return web.json_response(answer)


async def replay_one(
    client: aiohttp.ClientSession,
    url: str,
    wire: Wire,
    conversation: dict[str, Any],
    tally: Tally,
) -> None:
    session = session_of(conversation)
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
        # The bytes aiohttp's `json=` would send, kept to compare with what the upstream got.
        data = json.dumps(body).encode()
        tally.sent[session].append(_digest(data))
        headers = {
            "X-Session-Id": session,
            "Authorization": "Bearer replay",
            "Content-Type": "application/json",
        }
        started = time.perf_counter()
        async with client.post(url, data=data, headers=headers) as response:
            await response.read()
            status = response.headers.get("x-compaction-status", "?")
        elapsed = time.perf_counter() - started
        tally.requests += 1
        tally.statuses[status] += 1
        (tally.compaction_latency_s if status == "applied" else tally.plain_latency_s).append(
            elapsed
        )


def session_of(conversation: dict[str, Any]) -> str:
    return str(conversation["id"]).replace("/", "_")[:100]


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


async def replay_source(
    conversations: list[dict[str, Any]],
    window: int,
    wire: Wire,
    args: argparse.Namespace,
    *,
    compaction: dict[str, Any] | None = None,
    usage: bool = True,
) -> Tally:
    """`conversations` replayed at once through a proxy configured with `compaction` (on top of
    the replay's own), its upstream reporting `usage` or not; the tally ends with each session's
    /admin/sessions record."""
    tally = Tally()
    upstream = Upstream(wire, tally, window, args.summary_delay, args.reply_delay, usage)
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
                "compaction": {"summary_timeout_s": args.summary_delay * 5, **(compaction or {})},
                "memory": {"dir": memory},
                "admin": {"token": _ADMIN_TOKEN},
                "state": {"backend": "memory"},
            }
        )
        proxy_runner, proxy_url = await serve_on_loopback(create_app(settings))
        try:
            async with aiohttp.ClientSession() as client:
                await asyncio.gather(
                    *(
                        replay_one(client, f"{proxy_url}/v1/{wire.path}", wire, c, tally)
                        for c in conversations
                    )
                )
                for conversation in conversations:
                    session = session_of(conversation)
                    tally.records[session] = await read_records(client, proxy_url, session)
        finally:
            await proxy_runner.cleanup()
            await upstream_runner.cleanup()
    return tally


async def replay_on_and_shadow(
    conversations: list[dict[str, Any]],
    window: int,
    wire: Wire,
    args: argparse.Namespace,
    compaction: dict[str, Any] | None = None,
) -> tuple[Tally, Tally]:
    """The two replays of the shadow proof (see --shadow), `on` then `shadow`, both with
    `compaction` settings too."""
    options = {**_PROOF, **(compaction or {})}
    on = await replay_source(conversations, window, wire, args, compaction=options, usage=False)
    shadow = await replay_source(
        conversations, window, wire, args, compaction={**options, "mode": "shadow"}, usage=False
    )
    return on, shadow


async def read_records(client: aiohttp.ClientSession, proxy_url: str, session: str) -> Any:
    headers = {"Authorization": f"Bearer {_ADMIN_TOKEN}"}
    async with client.get(f"{proxy_url}/admin/sessions/{session}", headers=headers) as response:
        response.raise_for_status()
        return await response.json()


def comparable(found: Any, ids: dict[str, str] | None = None) -> Any:
    """`found` (a session's /admin record) less what says when and how long, its random
    compaction ids replaced by their order of appearance (`ids`: those met so far)."""
    ids = {} if ids is None else ids
    if isinstance(found, list):
        return [comparable(item, ids) for item in found]
    if not isinstance(found, dict):
        return found
    kept: dict[str, Any] = {}
    for key, value in found.items():
        if key in _TIMES or key == _MODE:
            continue
        if key in _IDS and isinstance(value, str):
            value = ids.setdefault(value, f"compaction #{len(ids) + 1}")
        kept[key] = comparable(value, ids)
    return kept


def shadow_differences(on: Tally, shadow: Tally) -> list[str]:
    """What shadow mode did otherwise than it should over the same traffic as `on` (none: the
    proof holds): a request it forwarded changed, a session whose records differ from on's."""
    problems = []
    for session, sent in sorted(shadow.sent.items()):
        forwarded = shadow.forwarded.get(session, [])
        changed = sum(a != b for a, b in zip(sent, forwarded, strict=False))
        changed += abs(len(sent) - len(forwarded))
        if changed:
            problems.append(
                f"{session}: {changed} of {len(sent)} requests forwarded otherwise than sent"
            )
    for session in sorted(on.records.keys() | shadow.records.keys()):
        expected = comparable(on.records.get(session))
        found = comparable(shadow.records.get(session))
        if found != expected:
            keys = _differing(expected, found)
            problems.append(f"{session}: records differ from on's at {keys}")
    return problems


def _differing(expected: Any, found: Any, at: str = "") -> str:
    """The first place where `found` differs from `expected`, as a path."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for key in sorted(expected.keys() | found.keys()):
            if expected.get(key) != found.get(key):
                return _differing(expected.get(key), found.get(key), f"{at}.{key}")
    if isinstance(expected, list) and isinstance(found, list) and len(expected) == len(found):
        for index, (a, b) in enumerate(zip(expected, found, strict=True)):
            if a != b:
                return _differing(a, b, f"{at}[{index}]")
    return f"{at or '.'} ({expected!r:.80} vs {found!r:.80})"


def report_shadow(on: Tally, shadow: Tally, problems: list[str]) -> None:
    requests = sum(len(sent) for sent in shadow.sent.values())
    records = sum(len(found.get("records", [])) for found in on.records.values())
    verdict = "holds" if not problems else f"FAILS ({len(problems)} problems)"
    print(
        f"  shadow proof {verdict}: {requests} requests in shadow, each forwarded as sent; "
        f"{len(on.records)} sessions' records ({records} compaction records) compared with on's"
    )
    for problem in problems:
        print(f"    {problem}")


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
    if args.shadow:
        print("shadow proof: on and shadow, no usage reported, nothing prepared ahead")
    dialects = list(WIRES) if args.dialect == "all" else [args.dialect]
    failed = False
    for dialect in dialects:
        wire = WIRES[dialect]
        for name, window in SOURCES.items():
            if args.sources and not any(name.startswith(prefix) for prefix in args.sources):
                continue
            conversations = pick(corpus_dir() / name, args.per_source)
            if not args.shadow:
                tally = await replay_source(conversations, window, wire, args)
                report(name, window, wire, tally, args.reply_delay)
                continue
            on, shadow = await replay_on_and_shadow(conversations, window, wire, args)
            report(name, window, wire, on, args.reply_delay)
            problems = shadow_differences(on, shadow)
            report_shadow(on, shadow, problems)
            failed = failed or bool(problems)
    return 1 if failed else 0


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
    parser.add_argument(
        "--shadow",
        action="store_true",
        help="replay each source again in compaction.mode shadow and check it against on",
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
