"""(b) of bench.hotpath: the proxy's own time for `reused` requests of long conversations, in
each API's shape (chat completions, Responses, Anthropic Messages; bench.dialects converts the
prose history, so Responses turns carry reasoning items with encrypted_content and Anthropic
turns thinking blocks with signatures).

Each history is compacted once, then grown by one short exchange per request; every request is
also sent to a bare aiohttp server that only reads the body (the floor), and the figure is the
proxy's own time (`x-compaction-proxy-overhead-ms`) minus the floor, medians. On a shared machine
the floor (another process reading megabytes) moves by milliseconds from run to run, so
`prepare_figures` also times the same requests in this process without HTTP: the compacting
hook's `prepare` alone, what the proxy adds to a request besides reading and sending it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from bench.dialects import WIRES
from bench.history import history
from proxy.app import create_app
from proxy.http import keys
from proxy.interception import RequestContext
from proxy.settings import Settings

WINDOW = 128_000
OVERHEAD = "x-compaction-proxy-overhead-ms"
STATUS = "x-compaction-status"
PATHS = {"chat": "chat/completions", "responses": "responses", "anthropic": "messages"}
DIALECTS = tuple(PATHS)
_HEADERS = {
    "Authorization": "Bearer sk-bench",
    "Content-Type": "application/json",
    "anthropic-version": "2023-06-01",
}


def body_of(dialect: str, messages: list[dict[str, Any]], *, marked: bool = False) -> bytes:
    """`marked` (Anthropic): cache_control on the last block of the last two user turns, as
    Anthropic documents for multi-turn clients (the marks move every request)."""
    if dialect == "chat":
        return orjson.dumps({"model": "gpt-4o", "messages": messages})
    payload = {**WIRES[dialect].body(messages, None), "model": "gpt-4o"}
    if marked and dialect == "anthropic":
        for turn in [t for t in payload["messages"] if t["role"] == "user"][-2:]:
            if isinstance(turn["content"], list):
                mark = {"cache_control": {"type": "ephemeral"}}
                turn["content"][-1] = {**turn["content"][-1], **mark}
    return orjson.dumps(payload)


def answer_of(path: str, text: str) -> bytes:
    """`text` as the API at `path` answers it, with no usage the proxy would calibrate from
    (the histories must stay the sizes they were built to be)."""
    for dialect, tail in PATHS.items():
        if path.endswith(f"/{tail}"):
            payload = WIRES[dialect].answer(text, 0)
            payload.pop("usage")
            return orjson.dumps(payload)
    return orjson.dumps(WIRES["chat"].answer(text, 0))


def grown(base: list[dict[str, Any]], repeats: int) -> list[list[dict[str, Any]]]:
    """The next `repeats` requests of a conversation: one short exchange more each time."""
    requests = []
    for k in range(repeats):
        base = [
            *base,
            {"role": "assistant", "content": f"Noted, step {k}."},
            {"role": "user", "content": f"And what about step {k + 1}?"},
        ]
        requests.append(base)
    return requests


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, sid: str
) -> tuple[str, float]:
    headers = {**_HEADERS, "X-Session-Id": sid}
    async with session.post(url, data=body, headers=headers) as response:
        await response.read()
        assert response.status == 200, response.status
        return response.headers.get(STATUS, "-"), float(response.headers[OVERHEAD])


async def reuse_figures(
    session: aiohttp.ClientSession,
    proxy: str,
    floor: str,
    run_id: str,
    windows_list: tuple[int, ...] = (1, 2, 5, 10, 20),
    dialects: tuple[str, ...] = ("chat",),
    repeats: int = 15,
) -> None:
    print("(b) reused requests: the proxy's own time (x-compaction-proxy-overhead-ms), medians")
    print(
        f"    {'dialect':>9} {'history':>8} {'MiB':>6} {'first':>16} {'reused':>7} "
        f"{'proxy ms':>9} {'floor ms':>9} {'own ms':>7} {'vs 1x':>6}"
    )
    for dialect in dialects:
        url, floor_url = (f"{base}/v1/{PATHS[dialect]}" for base in (proxy, floor))
        first_own = None
        for windows in windows_list:
            base = history(windows * WINDOW, tag=f"b{windows}{dialect}{run_id}-")
            sid = f"reuse-{dialect}-{windows}-{run_id}"
            started = time.perf_counter()
            first, _ = await _post(session, url, body_of(dialect, base), sid)
            first_s = time.perf_counter() - started
            bodies = [body_of(dialect, messages) for messages in grown(base, repeats)]
            statuses, proxy_ms, floor_ms = [], [], []
            for body in bodies:
                status, took = await _post(session, url, body, sid)
                statuses.append(status)
                proxy_ms.append(took)
                floor_ms.append((await _post(session, floor_url, body, sid))[1])
            own = statistics.median(proxy_ms) - statistics.median(floor_ms)
            first_own = own if first_own is None else first_own
            reused = sum(s == "reused" for s in statuses)
            print(
                f"    {dialect:>9} {windows:>7}x {len(bodies[0]) / 2**20:6.1f} {first:>8} "
                f"{first_s:6.1f} s {reused:>3}/{repeats:<3} {statistics.median(proxy_ms):9.2f} "
                f"{statistics.median(floor_ms):9.2f} {own:7.2f} {own / first_own:5.1f}x"
            )


class _InstantLLM:
    async def complete(self, messages: Any, *, purpose: str, max_tokens: int) -> str:
        if purpose == "memory":  # a reply the extraction reads (an unread one is logged)
            return '[{"type": "decision", "content": "Meet on Friday."}]'
        return "Goals: keep track of plans. Decisions: meet on Friday. Current state: planning."


async def prepare_figures(
    windows_list: tuple[int, ...],
    dialects: tuple[str, ...],
    repeats: int = 15,
    *,
    marked: bool = False,
) -> None:
    """The compacting hook's `prepare` for the same reused requests, in this process: default
    settings (SQLite state), compactions inline, the summarizer answering at once (`marked`:
    Anthropic bodies with moving cache_control marks, see body_of)."""
    print("(b) the same in this process, without HTTP: the hook's prepare (ms, medians)")
    print(
        f"    {'dialect':>9} {'history':>8} {'MiB':>6} {'reused':>7} {'known':>6} "
        f"{'prepare':>8} {'vs 1x':>6}"
    )
    for dialect in dialects:
        first_ms = None
        for windows in windows_list:
            with tempfile.TemporaryDirectory() as workspace:
                settings = Settings.build(
                    {
                        "memory": {"dir": f"{workspace}/memory"},
                        "state": {"path": f"{workspace}/state.sqlite3"},
                        "compaction": {"workers": 0},
                        # No upstream here to read a window from.
                        "models": {"discover": False},
                    }
                )
                app = create_app(settings, llm_for=lambda _: _InstantLLM())
                runner = web.AppRunner(app)  # its start-up opens the state and archive
                await runner.setup()
                try:
                    hook = app[keys.HOOK]
                    headers = CIMultiDictProxy(CIMultiDict({"Authorization": "Bearer sk-bench"}))
                    route = "messages" if dialect == "anthropic" else dialect
                    ctx = RequestContext(route, "prepare", "Bearer sk-bench", "/", headers)
                    base = history(windows * WINDOW, tag=f"p{windows}{dialect}-")
                    await hook.prepare(ctx, body_of(dialect, base, marked=marked))
                    took, statuses = [], []
                    bodies = [
                        body_of(dialect, messages, marked=marked)
                        for messages in grown(base, repeats)
                    ]
                    for body in bodies:
                        started = time.perf_counter()
                        exchange = await hook.prepare(ctx, body)
                        took.append((time.perf_counter() - started) * 1000)
                        outcome = exchange.outcome
                        statuses.append(outcome.status if outcome is not None else None)
                    # Decided from what is remembered, not by the full path (a precompute check).
                    known = app[keys.METRICS].registry.get_sample_value(
                        "compaction_proxy_recognized_requests_total",
                        {"decision": "known", "dialect": dialect},
                    )
                finally:
                    await runner.cleanup()

            median = statistics.median(took)
            first_ms = median if first_ms is None else first_ms
            reused = sum(s == "reused" for s in statuses)
            print(
                f"    {dialect:>9} {windows:>7}x {len(body) / 2**20:6.1f} {reused:>3}/{repeats:<3} "
                f"{int(known or 0):>6} {median:8.2f} {median / first_ms:5.1f}x"
            )
