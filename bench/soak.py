"""Soak: many agents for minutes against the real proxy; does memory level off, do errors stay 0?

    .venv/bin/python -m bench.soak [--seconds 600] [--agents 50] [--every 30] [--window 8000]
                                   [--max-slope-kb 64]

The proxy runs through its CLI (`python -m proxy`, the default config.yaml, its worker
processes) in its own process; a stand-in upstream (tests/fakes: FakeUpstream and the API
shapes of tests/fakes/apis) in another answers chat completions, Responses and Anthropic
Messages, streamed or not, summaries and memory extractions included. Only the window is small
(`--window`, as `models.default_context_window`) so conversations cross the trigger within a few
requests; the state file and memory directory are in a temporary directory; every other setting
is the default.

`--agents` agents run here, one API each in turn (chat, Responses, Anthropic), half of them
streaming; one stream in ten is cut by the client after its first chunk. An agent's
conversation starts at about half the window and grows by one exchange a request until it is
1.6 windows long (compacted on the way), then a new conversation (a new session) starts.

Every `--every` seconds a row: RSS of the proxy and of each process under it (its workers, from
/proc), the proxy's open fds, the state file's size, the sessions compacted so far, requests,
p50/p99 latency and errors since the last row, compactions by status. At the end: RSS slope
(linear fit, KB/s) of the first and the last half and their ratio, and of the last third; the
state file's size per compacted session, and what of it is the archive and what the checkpoints
and the rest (SQLite's `dbstat`). Exits 1 on any error (a status other than 200, a transport
error, an ERROR line in the proxy's log), when the proxy's RSS still rises faster than
`--max-slope-kb` KB/s over the last third, or, with `--set archive.max_total_mb=N`, when the state
file's peak over the last half is over N MiB plus what the checkpoints and the rest take:

    .venv/bin/python -m bench.soak --seconds 300 --set archive.max_total_mb=8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.dialects import WIRES
from bench.history import history
from bench.passthrough import _loop, free_port, wait_ready
from bench.reuse import PATHS
from tests.fakes.apis import (
    anthropic_events,
    anthropic_message,
    responses_events,
    responses_object,
)
from tests.fakes.upstream import (
    FakeUpstream,
    chat_chunk,
    chat_completion,
    json_reply,
    sse_events,
    stream_reply,
)

ROOT = Path(__file__).resolve().parents[1]
STATUS = "x-compaction-status"
DIALECTS = ("chat", "responses", "anthropic")
_HEADERS = {
    "Authorization": "Bearer sk-soak",
    "Content-Type": "application/json",
    "anthropic-version": "2023-06-01",
}
_SUMMARY = (
    "Goals: keep the release on track. Decisions: ship on Friday; keep the old API one more "
    "version. Facts: the build takes 14 minutes; the flaky test is test_retry. Open todos: "
    "update the changelog, ask Mel about the migration. Current state: reviewing the diff."
)
_MEMORY = '[{"type": "decision", "content": "Ship on Friday."}]'
_CUT_EVERY = 10
"""One stream in this many is cut by the client after its first chunk."""


# --- the stand-in upstream (a process of its own: `python -m bench.soak serve-upstream`) ------


async def _answer(request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
    """Whatever the proxy asks, in the API's shape; streamed when the body asks for a stream."""
    upstream.requests.clear()  # FakeUpstream records every request: not for minutes on end
    body = await request.read()
    purpose = request.headers.get("X-Compaction-Purpose", "")
    text = {"summary": _SUMMARY, "memory": _MEMORY}.get(purpose, "Done; next step.")
    streamed = b'"stream":true' in body  # the agents' bodies, as orjson writes them
    if request.path.endswith("/responses"):
        if streamed:
            return await stream_reply(responses_events(text))(request, upstream)
        return await json_reply(responses_object(text))(request, upstream)
    if request.path.endswith("/messages"):
        if streamed:
            return await stream_reply(anthropic_events(text))(request, upstream)
        return await json_reply(anthropic_message(text))(request, upstream)
    if streamed:
        chunks = sse_events(
            chat_chunk(text[:8]), chat_chunk(text[8:]), chat_chunk(None, finish=True)
        )
        return await stream_reply(chunks)(request, upstream)
    return await json_reply(chat_completion(text))(request, upstream)


def serve_upstream() -> None:
    """Serve until killed; the first line on stdout is the port."""

    async def serve() -> None:
        async with FakeUpstream(_answer) as upstream:
            print(upstream.port, flush=True)
            await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=_loop) as runner:
        runner.run(serve())


# --- agents -----------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the agents saw since the last row (latencies, errors) and in all (the rest)."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    requests: int = 0
    cut: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    total_requests: int = 0
    total_errors: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    compacted: set[str] = field(default_factory=set)
    """The sessions compacted so far (a request of theirs answered `applied`)."""

    def error(self, what: str) -> None:
        self.errors += 1
        self.total_errors += 1
        self.problems[what] += 1


class Agent:
    def __init__(self, number: int, texts: list[str], window: int, proxy: str) -> None:
        self.number = number
        self.dialect = DIALECTS[number % len(DIALECTS)]
        self.streams = number % 2 == 1
        self._texts = texts
        self._window = window
        self._url = f"{proxy}/v1/{PATHS[self.dialect]}"
        self._random = random.Random(number)
        self._conversation = 0

    async def run(self, session: aiohttp.ClientSession, tally: Tally, until: float) -> None:
        while time.monotonic() < until:
            await self._converse(session, tally, until)

    async def _converse(self, session: aiohttp.ClientSession, tally: Tally, until: float) -> None:
        """One conversation, a new session: from half a window to 1.6 windows, a turn at a time."""
        self._conversation += 1
        sid = f"soak-{self.number}-{self._conversation}"
        tag = f"[{sid}] "
        offset = self._random.randrange(len(self._texts))
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
        size, turn = 0, 0
        while size < 1.6 * self._window * 4 and time.monotonic() < until:
            while True:
                text = self._texts[(offset + turn) % len(self._texts)]
                role = "user" if turn % 2 == 0 else "assistant"
                messages.append({"role": role, "content": f"{tag}{turn} {text}"})
                size += len(text)
                turn += 1
                if role == "user" and size >= self._window * 2:
                    break
            await self._send(session, tally, messages, sid)

    async def _send(
        self,
        session: aiohttp.ClientSession,
        tally: Tally,
        messages: list[dict[str, Any]],
        sid: str,
    ) -> None:
        payload = {**WIRES[self.dialect].body(messages, None), "model": "soak-model"}
        if self.dialect == "anthropic":
            payload["max_tokens"] = 1024
        cut = False
        if self.streams:
            payload["stream"] = True
            cut = self._random.randrange(_CUT_EVERY) == 0
        headers = {**_HEADERS, "X-Session-Id": sid}
        started = time.perf_counter()
        tally.requests += 1
        tally.total_requests += 1
        try:
            async with session.post(self._url, data=orjson.dumps(payload), headers=headers) as r:
                if cut:
                    await r.content.readany()
                    r.close()  # the client goes away mid-stream
                    tally.cut += 1
                    return
                await r.read()
                tally.statuses[r.headers.get(STATUS, "-")] += 1
                if r.headers.get(STATUS) == "applied":
                    tally.compacted.add(sid)
                if r.status != 200:
                    tally.error(f"status {r.status}")
                    return
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.error(type(exc).__name__)
            return
        tally.latencies.append((time.perf_counter() - started) * 1000)


# --- sampling ---------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """Resident set size of `pid` in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (worker pool, its forkserver or resource tracker), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return sorted(found)


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def slope_kb_s(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, KiB) samples; 0 with fewer than two."""
    if len(samples) < 2:
        return 0.0
    return float(statistics.linear_regression(*zip(*samples, strict=True)).slope)


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


@dataclass
class Sampler:
    proxy_pid: int
    state_file: Path
    started: float
    rss: list[tuple[float, int]] = field(default_factory=list)
    state: list[tuple[float, int]] = field(default_factory=list)

    def header(self) -> None:
        print(
            f"{'t s':>5} {'proxy MB':>8} {'workers MB':>16} {'fds':>4} {'state MB':>8} "
            f"{'sessions':>8} {'req':>5} {'p50 ms':>7} {'p99 ms':>7} {'err':>4}  compactions"
        )

    def row(self, tally: Tally) -> None:
        elapsed = time.monotonic() - self.started
        proxy = rss_kb(self.proxy_pid)
        self.rss.append((elapsed, proxy))
        workers = (
            "+".join(f"{rss_kb(pid) / 1024:.0f}" for pid in descendants(self.proxy_pid)) or "-"
        )
        state = self.state_file.stat().st_size if self.state_file.exists() else 0
        self.state.append((elapsed, state))
        statuses = " ".join(f"{k}={v}" for k, v in sorted(tally.statuses.items()))
        print(
            f"{elapsed:5.0f} {proxy / 1024:8.1f} {workers:>16} {open_fds(self.proxy_pid):4d} "
            f"{state / 2**20:8.2f} {len(tally.compacted):8d} {tally.requests:5d} "
            f"{_percentile(tally.latencies, 0.5):7.1f} "
            f"{_percentile(tally.latencies, 0.99):7.1f} {tally.errors:4d}  {statuses}",
            flush=True,
        )
        tally.latencies.clear()
        tally.requests = tally.errors = 0


# --- orchestration ----------------------------------------------------------------------------


def _spawn(args: list[str], log: Any, stdout: Any = None, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=stdout or subprocess.DEVNULL,
        stderr=log,
    )


def _environment(assignments: list[str]) -> dict[str, str]:
    """`section.key=value` settings as the proxy's environment variables."""
    env = {}
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        section, _, key = name.partition(".")
        env[f"COMPACTION_PROXY__{section.upper()}__{key.upper()}"] = value
    return env


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def soak(options: argparse.Namespace) -> int:
    window = options.window
    texts = [m["content"] for m in history(window * 8, tag="soak-")[1:]]
    prx = free_port()
    workspace = tempfile.TemporaryDirectory(prefix="soak-")
    state_file = Path(workspace.name) / "state.sqlite3"
    proxy_log = Path(workspace.name) / "proxy.log"
    with proxy_log.open("wb") as log:
        upstream = _spawn(
            ["-m", "bench.soak", "serve-upstream"], subprocess.DEVNULL, subprocess.PIPE
        )
        assert upstream.stdout is not None
        up = int(upstream.stdout.readline())
        proxy = _spawn(
            [
                *("-m", "proxy", "--config", str(ROOT / "config.yaml")),
                *("--upstream", f"http://127.0.0.1:{up}/v1", "--port", str(prx)),
            ],
            log,
            COMPACTION_PROXY__UPSTREAM__ANTHROPIC_BASE_URL=f"http://127.0.0.1:{up}/v1",
            COMPACTION_PROXY__MODELS__DEFAULT_CONTEXT_WINDOW=str(window),
            COMPACTION_PROXY__STATE__PATH=str(state_file),
            COMPACTION_PROXY__MEMORY__DIR=str(Path(workspace.name) / "memory"),
            **_environment(options.set),
        )
        try:
            return await _drive(options, window, texts, prx, up, proxy.pid, state_file, proxy_log)
        finally:
            _stop(proxy)
            _stop(upstream)
            workspace.cleanup()


async def _drive(
    options: argparse.Namespace,
    window: int,
    texts: list[str],
    prx: int,
    up: int,
    proxy_pid: int,
    state_file: Path,
    proxy_log: Path,
) -> int:
    proxy = f"http://127.0.0.1:{prx}"
    await wait_ready(f"http://127.0.0.1:{up}/healthz")
    for attempt in range(6):  # on a loaded machine the proxy can take longer than 10 s to start
        try:
            await wait_ready(f"{proxy}/healthz")
            break
        except RuntimeError:
            if attempt == 5:
                raise
    print(
        f"soak: {options.agents} agents (chat, Responses, Anthropic; half streaming, 1 stream in "
        f"{_CUT_EVERY} cut), {options.seconds} s, window {window} tokens, config.yaml "
        f"{' '.join(options.set) or 'as it is'}"
    )
    tally = Tally()
    started = time.monotonic()
    until = started + options.seconds
    sampler = Sampler(proxy_pid, state_file, started)
    sampler.header()
    sampler.row(tally)
    agents = [Agent(n, texts, window, proxy) for n in range(options.agents)]
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        running = asyncio.gather(*(agent.run(session, tally, until) for agent in agents))
        while time.monotonic() < until:
            await asyncio.sleep(min(options.every, max(0.0, until - time.monotonic())))
            sampler.row(tally)
        await running
    logged_errors = sum(b'"ERROR"' in line for line in proxy_log.read_bytes().splitlines())
    failed = state_verdict(options, sampler.state, state_file, len(tally.compacted))
    return verdict(options, sampler.rss, tally, logged_errors) | failed


def archive_pages(state_file: Path) -> tuple[int, int] | None:
    """The bytes of the state file's archive (its tables and index) and of the rest
    (checkpoints, cooldowns, the schema), read beside the running proxy (read-only), or None
    where SQLite has no `dbstat`."""
    try:
        with sqlite3.connect(f"file:{state_file}?mode=ro", uri=True) as reader:
            rows = reader.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
    except sqlite3.Error:
        return None
    archive = sum(size for name, size in rows if "archive" in name)
    return archive, sum(size for _, size in rows) - archive


def state_verdict(
    options: argparse.Namespace, state: list[tuple[float, int]], state_file: Path, sessions: int
) -> int:
    """The state file's size over the run; with `archive.max_total_mb` set, 1 when the file
    does not level off under it plus what the rest of the file takes."""
    bound_mb = next(
        (float(each.partition("=")[2]) for each in options.set
         if each.startswith("archive.max_total_mb=")),
        None,
    )  # fmt: skip
    pages = archive_pages(state_file)
    last = state[-1][1] / 2**20
    late = max(size for at, size in state if at >= state[-1][0] / 2) / 2**20
    print(
        f"state file {last:.2f} MiB for {sessions} compacted sessions "
        f"({last * 1024 / max(1, sessions):.0f} KiB a session); peak over the last half {late:.2f} MiB"
        + ("" if pages is None else
           f"; archive {pages[0] / 2**20:.2f} MiB, checkpoints and the rest {pages[1] / 2**20:.2f} MiB")
    )  # fmt: skip
    if bound_mb is None or pages is None:
        return 0
    within = late <= bound_mb + pages[1] / 2**20
    print(
        f"archive.max_total_mb {bound_mb:g}: the last half {'within' if within else 'OVER'} "
        f"{bound_mb:g} + {pages[1] / 2**20:.2f} MiB: {'PASS' if within else 'FAIL'}"
    )
    return 0 if within else 1


def verdict(
    options: argparse.Namespace, rss: list[tuple[float, int]], tally: Tally, logged_errors: int
) -> int:
    """Print the totals and the RSS slopes; 1 on any error or a last third rising too fast."""
    end = rss[-1][0]
    first = slope_kb_s([s for s in rss if s[0] <= end / 2])
    last = slope_kb_s([s for s in rss if s[0] >= end / 2])
    third = slope_kb_s([s for s in rss if s[0] >= end * 2 / 3])
    ratio = last / first if first > 0 else float("inf") if last > 0 else 0.0
    statuses = " ".join(f"{k}={v}" for k, v in sorted(tally.statuses.items()))
    print(
        f"requests {tally.total_requests} (streams cut by the client: {tally.cut}), "
        f"errors {tally.total_errors} {dict(tally.problems) or ''}, ERROR lines logged "
        f"{logged_errors}; compaction statuses: {statuses}"
    )
    print(
        f"proxy RSS {rss[0][1] / 1024:.0f} -> {max(s[1] for s in rss) / 1024:.0f} MB (peak) -> "
        f"{rss[-1][1] / 1024:.0f} MB; slope first half {first:.1f} KB/s, last half {last:.1f} "
        f"KB/s ({ratio:.0%} of the first), last third {third:.1f} KB/s "
        f"(limit {options.max_slope_kb:.0f})"
    )
    failed = tally.total_errors > 0 or logged_errors > 0 or third > options.max_slope_kb
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "serve-upstream"])
    parser.add_argument("--seconds", type=int, default=600, help="how long (default 600)")
    parser.add_argument("--agents", type=int, default=50, help="concurrent agents (default 50)")
    parser.add_argument("--every", type=float, default=30, help="seconds between rows (30)")
    parser.add_argument(
        "--window", type=int, default=8000, help="context window of the soak's model (8000)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a setting other than the default (repeatable), e.g. compaction.known_requests_mb=8",
    )
    parser.add_argument(
        "--max-slope-kb",
        type=float,
        default=64,
        help="fail when the proxy's RSS rises faster than this over the last third (KB/s, 64)",
    )
    options = parser.parse_args()
    if options.mode == "serve-upstream":
        serve_upstream()
        return
    with asyncio.Runner(loop_factory=_loop) as runner:
        sys.exit(runner.run(soak(options)))


if __name__ == "__main__":
    main()
