"""(b) of bench.hotpath: the proxy's own time for `reused` requests of long conversations, in
each API's shape (chat completions, Responses, Anthropic Messages; bench.dialects converts the
prose history, so Responses turns carry reasoning items with encrypted_content and Anthropic
turns thinking blocks with signatures).

Each history is compacted once, then grown by one short exchange per request; every request is
also sent to a bare aiohttp server that only reads the body (the floor), and the figure is the
proxy's own time (`x-compaction-proxy-overhead-ms`) minus the floor, medians.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import aiohttp
import orjson

from bench.dialects import WIRES
from bench.history import history

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


def body_of(dialect: str, messages: list[dict[str, Any]]) -> bytes:
    if dialect == "chat":
        return orjson.dumps({"model": "gpt-4o", "messages": messages})
    return orjson.dumps({**WIRES[dialect].body(messages, None), "model": "gpt-4o"})


def answer_of(path: str, text: str) -> bytes:
    """`text` as the API at `path` answers it, with no usage the proxy would calibrate from
    (the histories must stay the sizes they were built to be)."""
    for dialect, tail in PATHS.items():
        if path.endswith(f"/{tail}"):
            payload = WIRES[dialect].answer(text, 0)
            payload.pop("usage")
            return orjson.dumps(payload)
    return orjson.dumps(WIRES["chat"].answer(text, 0))


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
            bodies = []
            for k in range(repeats):
                base += [
                    {"role": "assistant", "content": f"Noted, step {k}."},
                    {"role": "user", "content": f"And what about step {k + 1}?"},
                ]
                bodies.append(body_of(dialect, base))
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
