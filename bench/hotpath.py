"""The hot path: does one conversation's compaction or size cost anyone else, or cost per request?

    .venv/bin/python -m bench.hotpath [--only abcde] [--big-mb 50] [--wrk-duration 4]
                                      [--stall-windows 1,5] [--windows 1,2,5,10,20]
                                      [--dialect chat|responses|anthropic|all] [--marked]

The proxy runs through its CLI (default config, uvloop, JSON access log on) in its own process,
against a stand-in upstream in another that answers everything at once (summaries included); the
client runs here. Histories are real prose (bench.history). One run prints:

(a) other sessions' small chat requests and `/healthz`, polled every 5 ms from this process:
    their p99 and max latency, and how many took over 100 ms, while one session compacts a 1x and
    a 5x window history (`--stall-windows`; samples overlapping the compacting request, plus
    250 ms after it). Targets at 5x: p99 <= 50, max <= 100.
(b) the proxy's own time (`x-compaction-proxy-overhead-ms`) for `reused` requests of 1x ... 20x
    window histories, medians, with the floor measured in the same run: a bare aiohttp server's
    time to read the same body off the socket. Targets: own time minus floor <= 5 ms at 10x,
    growth 1x -> 10x <= 2.5x. `--dialect` runs it in the Responses or Anthropic shape too
    (bench.reuse). Then the same requests in this process without HTTP: the hook's `prepare`
    (`--marked`: Anthropic bodies whose cache_control marks move to the newest turns).
(c) CPU (process time) of the library per 128k tokens folded, in this process, prose and coding
    histories of 1x and 4x a window; the summarizer answers at once. Target <= 20 ms, linear.
    Then a fold redone over a 10% longer history in one worker process (as the proxy runs it):
    wall time cold, and after the 4x fold (what the worker scanned then is not scanned again).
(d) pass-through req/s and added median against a minimal aiohttp forwarder, with wrk
    (bench.wrk). Targets: >= 0.9x (2 KB), >= 0.8x (400 KB), added median <= 1.3x.
(e) one `--big-mb` MiB prose body over the trigger: status, compaction status and seconds.
    Target: 200 within 30 s, compacted.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.history import history, source_label
from bench.passthrough import COMPLETION, _loop, free_port, spawn, stop, wait_ready
from bench.reuse import DIALECTS, answer_of, prepare_figures, reuse_figures
from bench.wrk import passthrough_figures
from compaction import Compaction, Compactor, HeuristicEstimator
from proxy.compacting.background.workers import Workers

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 128_000
OVERHEAD = "x-compaction-proxy-overhead-ms"
STATUS = "x-compaction-status"
_AUTH = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
_SUMMARY = (
    "Goals: the user asked to keep track of plans and dates. Decisions: meet on Friday; use the "
    "blue notebook. Facts: the trip costs 420 dollars, departure 2023-05-07. Open todos: book "
    "the train, call Mel. Preferences: short answers, metric units. Current state: planning."
)
_MEMORY = '[{"type": "decision", "content": "Meet on Friday."}]'


# --- servers (subprocesses: `python -m bench.hotpath serve-<kind> PORT`) ----------------------


def _reply(content: str) -> bytes:
    """A completion without `usage`: reported counts would move the proxy's calibration, and the
    histories here must stay the sizes they were built to be."""
    payload = orjson.loads(COMPLETION)
    payload["choices"][0]["message"]["content"] = content
    del payload["usage"]
    return orjson.dumps(payload)


def serve_upstream(port: int) -> None:
    """Answers requests, summaries and memory extractions at once, in the API's shape."""
    texts = {"summary": _SUMMARY, "memory": _MEMORY}
    answers = {"summary": _reply(_SUMMARY), "memory": _reply(_MEMORY)}
    plain = _reply("ok")

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        purpose = request.headers.get("X-Compaction-Purpose", "")
        if request.path.endswith(("/responses", "/messages")):
            body = answer_of(request.path, texts.get(purpose, "ok"))
        else:
            body = answers.get(purpose, plain)
        return web.Response(body=body, content_type="application/json")

    _serve(port, chat)


def serve_floor(port: int) -> None:
    """A bare aiohttp server that reads the body and says how long that took (its handler's
    start is where the proxy's own overhead clock starts too)."""

    async def read(request: web.Request) -> web.Response:
        started = time.perf_counter()
        await request.read()
        took = f"{(time.perf_counter() - started) * 1000:.3f}"
        return web.Response(body=COMPLETION, headers={OVERHEAD: took})

    _serve(port, read)


def _serve(port: int, handler: Any) -> None:
    app = web.Application(client_max_size=256 * 1024**2)
    app.router.add_route("*", "/{tail:.*}", handler)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=_loop())


# --- (a) other sessions during a compaction ---------------------------------------------------


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _chat(messages: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


async def stall_figures(
    session: aiohttp.ClientSession, proxy: str, run_id: str, sizes: tuple[int, ...]
) -> None:
    print("(a) other sessions while one compacts (ms; 4 sessions + /healthz, each every 5 ms)")
    tiny = _chat([{"role": "user", "content": "hi"}])
    for windows in sizes:
        body = _chat(history(windows * WINDOW, tag=f"a{windows}{run_id}-"))
        samples: dict[str, list[tuple[float, float]]] = {"chat": [], "healthz": []}
        stop = asyncio.Event()

        async def poll(
            kind: str, call: Any, stop: asyncio.Event = stop, samples: Any = samples
        ) -> None:
            while not stop.is_set():
                started = time.perf_counter()
                async with call() as response:
                    await response.read()
                samples[kind].append((started, time.perf_counter()))
                await asyncio.sleep(0.005)

        def other(i: int) -> Any:
            headers = {**_AUTH, "X-Session-Id": f"other-{i}"}
            return session.post(f"{proxy}/v1/chat/completions", data=tiny, headers=headers)

        pollers = [asyncio.create_task(poll("chat", lambda i=i: other(i))) for i in range(4)] + [
            asyncio.create_task(poll("healthz", lambda: session.get(f"{proxy}/healthz")))
        ]
        await asyncio.sleep(0.5)
        headers = {**_AUTH, "X-Session-Id": f"stall-{windows}-{run_id}"}
        started = time.perf_counter()
        async with session.post(
            f"{proxy}/v1/chat/completions", data=body, headers=headers
        ) as response:
            await response.read()
            status, compaction = response.status, response.headers.get(STATUS)
        ended = time.perf_counter()
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*pollers)
        line = [f"    {windows:>2}x window ({len(body) / 2**20:.1f} MiB): {status} {compaction} "]
        line.append(f"in {(ended - started) * 1000:.0f} ms;")
        for kind, spans in samples.items():
            during = [(e - s) * 1000 for s, e in spans if e >= started and s <= ended + 0.25]
            slow = sum(took > 100 for took in during)
            line.append(
                f"{kind} n={len(during)} p99 {_p99(during):.1f} max {max(during):.1f} "
                f"over 100: {slow};"
            )
        print(" ".join(line))


# --- (c) CPU per 128k tokens folded -----------------------------------------------------------


class _InstantLLM:
    async def complete(self, messages: Any, *, purpose: str, max_tokens: int) -> str:
        return _SUMMARY if purpose == "summary" else _MEMORY


async def cpu_figures() -> None:
    print("(c) library CPU per 128k tokens folded (process time; plan + run; LLM answers at once)")
    estimator = HeuristicEstimator()
    for source in ("prose", "coding"):
        for windows in (1, 4):
            messages = history(windows * WINDOW, source=source, tag=f"c{windows}-")
            compactor = Compactor()
            started = time.process_time()
            compaction = await compactor.prepare(messages, window=WINDOW)
            plan = compaction.plan
            result = await compaction.run(llm=_InstantLLM(), session_id=None)
            cpu = time.process_time() - started
            folded = sum(estimator.count_message(messages[i]) for i in plan.folded)
            print(
                f"    {source:>6} {windows}x ({source_label(source)}): {result.path}, "
                f"{folded / 1000:.0f}k tokens folded, {cpu * 1000:.0f} ms CPU, "
                f"{cpu * 1000 / (folded / WINDOW):.1f} ms per 128k"
            )


async def redone_figures() -> None:
    """A fold redone over a longer history (a precomputed compaction the conversation overtook),
    in a worker process as the proxy runs it: the worker keeps what it scanned before."""
    print("(c) a fold redone over a 10% longer history, through one worker process (wall ms)")
    for source in ("prose", "coding"):
        longer = history(int(4.4 * WINDOW), source=source, tag="r-")
        cut = len(longer) * 10 // 11
        shorter = longer[: cut + (longer[cut]["role"] == "user")]  # ends on a user message
        took = []
        for earlier in ([], [shorter]):
            workers = Workers(1)
            workers.open()
            compactor = Compactor(offload=workers)
            try:
                warm_up = history(WINDOW // 2, source=source, tag="w-")  # starts the worker
                await _compact(compactor, warm_up, WINDOW // 4)
                for messages in earlier:
                    await _compact(compactor, messages, WINDOW)
                started = time.perf_counter()
                await _compact(compactor, longer, WINDOW)
                took.append((time.perf_counter() - started) * 1000)
            finally:
                await workers.close()
        print(f"    {source:>6} 4.4x: {took[0]:.0f} ms cold, {took[1]:.0f} ms after the 4x fold")


async def _compact(compactor: Compactor, messages: list[dict[str, Any]], window: int) -> None:
    plan = compactor.plan(messages, window=window)  # on this thread, as it always was here
    await Compaction(compactor, messages, plan).run(llm=_InstantLLM(), session_id=None)


# --- (e) one very large body ------------------------------------------------------------------


async def big_figures(session: aiohttp.ClientSession, proxy: str, mb: float, run_id: str) -> None:
    body = _chat(history(int(mb * 2**20 / 4.4), tag=f"e{run_id}-"))
    headers = {**_AUTH, "X-Session-Id": f"big-{run_id}"}
    started = time.perf_counter()
    try:
        async with session.post(
            f"{proxy}/v1/chat/completions",
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=180),
        ) as response:
            await response.read()
            outcome = f"{response.status} {response.headers.get(STATUS)}"
    except TimeoutError:
        outcome = "no answer within 180 s"
    took = time.perf_counter() - started
    print(f"(e) {len(body) / 2**20:.1f} MiB prose body over the trigger: {outcome} in {took:.1f} s")


# --- orchestration ----------------------------------------------------------------------------


async def run(
    only: str,
    big_mb: float,
    wrk_duration: int,
    windows: tuple[int, ...],
    dialects: tuple[str, ...] = ("chat",),
    marked: bool = False,
    stall_windows: tuple[int, ...] = (1, 5),
) -> None:
    up, prx, flr = free_port(), free_port(), free_port()
    upstream, proxy, floor = (f"http://127.0.0.1:{p}" for p in (up, prx, flr))
    memory = tempfile.TemporaryDirectory()
    processes = [
        spawn(["-m", "bench.hotpath", "serve-upstream", str(up)]),
        spawn(["-m", "bench.hotpath", "serve-floor", str(flr)]),
        spawn(
            [
                *("-m", "proxy", "--upstream", f"{upstream}/v1", "--port", str(prx)),
                *("--config", str(ROOT / "config.yaml")),
            ],
            COMPACTION_PROXY__MEMORY__DIR=memory.name,
            COMPACTION_PROXY__UPSTREAM__ANTHROPIC_BASE_URL=f"{upstream}/v1",
        ),
    ]
    run_id = uuid.uuid4().hex[:6]
    try:
        for url in (upstream, proxy, floor):
            await wait_ready(f"{url}/healthz")
        print(f"hot-path benchmark: history {source_label('prose')}, window {WINDOW} tokens")
        timeout = aiohttp.ClientTimeout(total=600)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            if "a" in only:
                await stall_figures(session, proxy, run_id, stall_windows)
            if "b" in only:
                await reuse_figures(session, proxy, floor, run_id, windows, dialects)
            if "c" in only:
                await cpu_figures()
                await redone_figures()
            if "e" in only and big_mb > 0:
                await big_figures(session, proxy, big_mb, run_id)
    finally:
        stop(processes)
        memory.cleanup()
    if "b" in only:  # in this process, once the servers are gone
        await prepare_figures(windows, dialects, marked=marked)
    if "d" in only:
        await passthrough_figures(wrk_duration)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath")
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "serve-upstream", "serve-floor"]
    )
    parser.add_argument("args", nargs="*")
    parser.add_argument("--only", default="abcde", help="sections to run, e.g. 'ab'")
    parser.add_argument("--big-mb", type=float, default=50, help="(e) body size; 0 skips it")
    parser.add_argument("--wrk-duration", type=int, default=4, help="(d) seconds per wrk run")
    parser.add_argument(
        "--stall-windows",
        default="1,5",
        help="(a) sizes of the compacting history, in windows (default 1,5)",
    )
    parser.add_argument(
        "--windows",
        default="1,2,5,10,20",
        help="(b) history sizes, in windows (default 1,2,5,10,20)",
    )
    parser.add_argument(
        "--dialect",
        default="chat",
        choices=[*DIALECTS, "all"],
        help="(b) the API shape of the reused requests (default chat)",
    )
    parser.add_argument(
        "--marked",
        action="store_true",
        help="(b) in-process table: Anthropic bodies whose cache_control marks move each request",
    )
    options = parser.parse_args()
    if options.mode == "serve-upstream":
        serve_upstream(int(options.args[0]))
    elif options.mode == "serve-floor":
        serve_floor(int(options.args[0]))
    else:
        with asyncio.Runner(loop_factory=_loop) as runner:
            windows = tuple(int(w) for w in options.windows.split(","))
            stall_windows = tuple(int(w) for w in options.stall_windows.split(","))
            dialects = DIALECTS if options.dialect == "all" else (options.dialect,)
            runner.run(
                run(
                    options.only,
                    options.big_mb,
                    options.wrk_duration,
                    windows,
                    dialects,
                    options.marked,
                    stall_windows,
                )
            )


if __name__ == "__main__":
    main()
