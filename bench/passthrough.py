"""Pass-through overhead: what the proxy adds to a chat request that needs no compaction.

    .venv/bin/python -m bench.passthrough [--quick]

Starts, each in its own process (so the load generator does not starve them): a fast stand-in
upstream, a bare ~40-line aiohttp pass-through (the baseline any proxy pays), and the real proxy
through its CLI (`python -m proxy`, uvloop, JSON access log on). The client runs here. For a
2 KB and a 400 KB chat request at concurrency 1 and 16 it prints median and p99 latency going
direct / via the baseline / via the proxy (compaction off, and with the default config), the latency
each adds over direct, requests per second, and the proxy-vs-baseline ratios. Targets: the proxy's added median within 1.5x the baseline's,
throughput at least 80% of it. Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101},
    }
)


# --- servers (run as subprocesses: `python -m bench.passthrough serve-<kind> PORT [UPSTREAM]`) ---


def serve_upstream(port: int) -> None:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=COMPLETION, content_type="application/json")

    app = web.Application(client_max_size=256 * 1024**2)
    app.router.add_route("*", "/{tail:.*}", chat)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=_loop())


def serve_baseline(port: int, upstream: str) -> None:
    """The bare pass-through: read the body, forward it, stream the answer back."""
    hop = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}

    async def session_ctx(app: web.Application) -> object:
        app["session"] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with request.app["session"].request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            response = web.StreamResponse(status=answer.status)
            for name, value in answer.headers.items():
                if name.lower() not in hop:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application(client_max_size=256 * 1024**2)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=_loop())


def _loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# --- load generation -------------------------------------------------------------------------


@dataclass
class Result:
    latencies_ms: list[float]
    wall_s: float

    @property
    def median(self) -> float:
        return statistics.median(self.latencies_ms)

    @property
    def p99(self) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    @property
    def rps(self) -> float:
        return len(self.latencies_ms) / self.wall_s

    def merge(self, other: Result) -> Result:
        return Result(self.latencies_ms + other.latencies_ms, self.wall_s + other.wall_s)


def chat_body(size: int) -> bytes:
    filler = "lorem ipsum dolor sit amet " * (size // 27 + 1)
    head = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": ""},
        ],
    }
    base = len(orjson.dumps(head))
    head["messages"][1]["content"] = filler[: max(0, size - base)]
    return orjson.dumps(head)


async def load(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    concurrency: int,
    requests: int,
    session_id: str | None = None,
) -> Result:
    latencies: list[float] = []
    remaining = requests
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    if session_id is not None:
        headers["X-Session-Id"] = session_id

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(latencies, time.perf_counter() - started)


# --- orchestration ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(url) as response:
                    await response.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Ask every process to stop, then wait for each (they stop in parallel)."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=30)


def spawn(args: list[str], **env_extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def run(quick: bool) -> None:
    up_port, base_port, proxy_port, full_port = free_port(), free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    proxy_args = [
        "-m",
        "proxy",
        "--upstream",
        f"{upstream}/v1",
        "--config",
        str(ROOT / "config.yaml"),
    ]
    processes = [
        spawn(["-m", "bench.passthrough", "serve-upstream", str(up_port)]),
        spawn(["-m", "bench.passthrough", "serve-baseline", str(base_port), upstream]),
        # "proxy": the forwarder alone; "proxy+c": the default config, compaction on (the 400 KB
        # body, ~100k tokens, is past precompute_ratio of a 128k window, so it is parsed).
        spawn(
            [*proxy_args, "--port", str(proxy_port)], COMPACTION_PROXY__COMPACTION__ENABLED="false"
        ),
        spawn([*proxy_args, "--port", str(full_port)]),
    ]
    try:
        targets = {
            "direct": f"{upstream}/v1/chat/completions",
            "baseline": f"http://127.0.0.1:{base_port}/v1/chat/completions",
            "proxy": f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
            "proxy+c": f"http://127.0.0.1:{full_port}/v1/chat/completions",
        }
        for url in targets.values():
            await wait_ready(url.replace("/v1/chat/completions", "/healthz"))
        scale = 0.25 if quick else 1.0
        cells = [(2_000, 1, 2000), (2_000, 16, 6000), (400_000, 1, 600), (400_000, 16, 1600)]
        print(
            f"pass-through benchmark: {os.cpu_count()} CPUs, upstream + baseline + proxy in "
            "separate processes, client in this one; latencies in ms"
        )
        print(
            f"{'body':>7} {'conc':>4} {'target':>9} {'median':>8} {'p99':>8} {'added med':>10} "
            f"{'added p99':>10} {'req/s':>8}"
        )
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            for size, concurrency, count in cells:
                body = chat_body(size)
                count = max(50, int(count * scale))
                results: dict[str, Result] = {}
                for url in targets.values():  # warm pools and caches
                    await load(session, url, body, concurrency, max(20, count // 10))
                for _ in range(2):  # two interleaved rounds, merged, to even out drift
                    for name, url in targets.items():
                        got = await load(session, url, body, concurrency, count // 2)
                        results[name] = results[name].merge(got) if name in results else got
                report(size, concurrency, results)
    finally:
        stop(processes)


def report(size: int, concurrency: int, results: dict[str, Result]) -> None:
    direct = results["direct"]
    label = f"{size // 1000} KB"
    added: dict[str, tuple[float, float]] = {}
    for name, result in results.items():
        add_med, add_p99 = result.median - direct.median, result.p99 - direct.p99
        added[name] = (add_med, add_p99)
        shown = ("" if name == "direct" else f"{add_med:10.3f} {add_p99:10.3f}").rjust(21)
        print(
            f"{label:>7} {concurrency:>4} {name:>9} {result.median:8.3f} {result.p99:8.3f} "
            f"{shown} {result.rps:8.0f}"
        )

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "n/a"

    for name in ("proxy", "proxy+c"):
        print(
            f"{'':>13} {name} vs baseline: added median "
            f"{ratio(added[name][0], added['baseline'][0])} (target <= 1.5x), throughput "
            f"{results[name].rps / results['baseline'].rps:.0%} (target >= 80%)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.passthrough")
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "serve-upstream", "serve-baseline"]
    )
    parser.add_argument("args", nargs="*")
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    options = parser.parse_args()
    if options.mode == "serve-upstream":
        serve_upstream(int(options.args[0]))
    elif options.mode == "serve-baseline":
        serve_baseline(int(options.args[0]), options.args[1])
    else:
        with asyncio.Runner(loop_factory=_loop) as runner:
            runner.run(run(options.quick))


if __name__ == "__main__":
    main()
