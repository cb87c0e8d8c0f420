"""What each state backend costs on the hot path, and what Redis saves across replicas.

1. Reused-request latency: one conversation compacted once, then the same follow-up request
   (served from its checkpoint) sent again and again to a proxy on each backend, the backends
   interleaved request by request so that they share the machine's noise. Printed: p50 and p90
   per backend, each p50 minus the memory backend's, and the median of the paired differences
   (request i on a backend minus request i on memory, sent back to back).
2. Summarizer calls: N growing conversations replayed request by request, round-robin across 1 or
   3 replicas (as a load balancer would), with the memory backend (each replica on its own) and
   with Redis (shared). Printed: summarizer calls, requests that compacted or reused, and how
   often a conversation's forwarded summary changed (each change is a prompt-cache miss).

Replicas are apps in this process, each with its own backend object: the memory backend shares
nothing between them, exactly as separate processes would not. Needs redis-server on PATH
(`make bench` installs it); without it the Redis rows are left out.

    .venv/bin/python -m bench.state [--requests 300] [--conversations 6] [--turns 120]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.settings import Settings

WINDOW = 16000
SUMMARY = "## Goals and requests\n- continue the task\n## Current state\n- in progress"


class Upstream:
    """Answers chat calls at once and summary calls after `summary_delay_s`; counts them and
    the distinct summaries each session was sent."""

    def __init__(self, summary_delay_s: float) -> None:
        self.summary_delay_s = summary_delay_s
        self.summary_calls = 0
        self.summaries: dict[str, list[bytes]] = defaultdict(list)

    async def handle(self, request: web.Request) -> web.Response:
        purpose = request.headers.get("X-Compaction-Purpose")
        if purpose == "summary":
            self.summary_calls += 1
            await asyncio.sleep(self.summary_delay_s)
            return _answer(f"{SUMMARY}\n- call {self.summary_calls}")
        if purpose == "memory":
            await asyncio.sleep(self.summary_delay_s / 2)
            return _answer("[]")
        payload = orjson.loads(await request.read())
        second = payload["messages"][1] if len(payload["messages"]) > 1 else None
        if isinstance(second, dict) and "compaction-proxy" in str(second.get("content", "")):
            seen = self.summaries[request.headers.get("X-Session-Id", "-")]
            body = orjson.dumps(second)
            if not seen or seen[-1] != body:
                seen.append(body)
        return _answer("ok")


def _answer(text: str) -> web.Response:
    message = {"role": "assistant", "content": text}
    return web.json_response(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1},
        }
    )


def conversation(seed: int, turns: int) -> list[dict[str, Any]]:
    """A coding agent's history: a user task, then tool calls with ~1.5 KB outputs."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent. Use the bash tool."},
        {"role": "user", "content": f"Task {seed}: make the test suite of project {seed} pass."},
    ]
    for i in range(turns):
        call = {
            "id": f"call_{seed}_{i}",
            "type": "function",
            "function": {
                "name": "bash",
                "arguments": orjson.dumps({"cmd": f"pytest -k t{i}"}).decode(),
            },
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        output = f"FAILED tests/test_{seed}_{i}.py::test_case - AssertionError: {i}\n" * 24
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        if i % 4 == 3:
            messages.append({"role": "assistant", "content": f"Fixed part {i}."})
            messages.append({"role": "user", "content": f"Good, continue with step {i + 1}."})
    return messages


def requests_of(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each prefix ending in a user or tool message: what the agent sent, request by request."""
    return [messages[: i + 1] for i, m in enumerate(messages) if m["role"] in ("user", "tool")]


def settings_for(upstream_url: str, backend: dict[str, Any], memory_dir: str) -> Settings:
    return Settings.model_validate(
        {
            "upstream": {"base_url": f"{upstream_url}/v1"},
            "models": {"default_context_window": WINDOW},
            "memory": {"dir": memory_dir},
            "state": backend,
        }
    )


@contextlib.asynccontextmanager
async def redis_server(*options: str) -> AsyncIterator[str | None]:
    """A redis-server of its own on a free port (`options` on its command line), or None where
    there is none."""
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server not found on PATH: the redis rows are left out")
        yield None
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        *options, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.025)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        await process.wait()


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner, url = await serve_on_loopback(app)
    try:
        yield url
    finally:
        await runner.cleanup()


async def post(client: aiohttp.ClientSession, url: str, messages: list[Any], session: str) -> str:
    body = orjson.dumps({"model": "bench", "messages": messages})
    headers = {"X-Session-Id": session, "Content-Type": "application/json"}
    async with client.post(f"{url}/v1/chat/completions", data=body, headers=headers) as response:
        await response.read()
        return response.headers.get("x-compaction-status", "?")


async def hot_path(backends: dict[str, dict[str, Any]], count: int, tmp: Path) -> None:
    upstream = Upstream(summary_delay_s=0.0)
    app = web.Application(client_max_size=2**30)
    app.router.add_post("/v1/chat/completions", upstream.handle)
    async with contextlib.AsyncExitStack() as stack:
        upstream_url = await stack.enter_async_context(serving(app))
        urls = {
            name: await stack.enter_async_context(
                serving(create_app(settings_for(upstream_url, backend, str(tmp / name))))
            )
            for name, backend in backends.items()
        }
        messages = conversation(0, 60)
        follow_up = [
            *messages,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "next"},
        ]
        samples: dict[str, list[float]] = {name: [] for name in urls}
        async with aiohttp.ClientSession() as client:
            for url in urls.values():
                await post(client, url, messages, "hot")
                for _ in range(20):  # warm up: connections, caches
                    assert await post(client, url, follow_up, "hot") == "reused"
            for _ in range(count):
                for name, url in urls.items():
                    started = time.perf_counter()
                    await post(client, url, follow_up, "hot")
                    samples[name].append((time.perf_counter() - started) * 1000)
    print(f"\nReused request, {len(follow_up)} messages, {count} requests per backend (ms):")
    print(f"{'backend':>8} {'p50':>8} {'p90':>8} {'p50 - memory':>14} {'paired median':>14}")
    base = samples["memory"]
    for name, values in samples.items():
        p50 = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        # Request i of every backend ran back to back: their difference cancels the bursts of a
        # shared machine that a difference of medians keeps.
        paired = statistics.median(v - b for v, b in zip(values, base, strict=True))
        print(
            f"{name:>8} {p50:8.3f} {p90:8.3f} {p50 - statistics.median(base):+14.3f} {paired:+14.3f}"
        )


async def replicas(
    backend: dict[str, Any], replica_count: int, conversations: int, turns: int, tmp: Path
) -> tuple[int, dict[str, int], float]:
    upstream = Upstream(summary_delay_s=0.3)
    app = web.Application(client_max_size=2**30)
    app.router.add_post("/v1/chat/completions", upstream.handle)
    statuses: dict[str, int] = defaultdict(int)
    async with contextlib.AsyncExitStack() as stack:
        upstream_url = await stack.enter_async_context(serving(app))
        urls = [
            await stack.enter_async_context(
                serving(create_app(settings_for(upstream_url, backend, str(tmp / f"r{i}"))))
            )
            for i in range(replica_count)
        ]
        async with aiohttp.ClientSession() as client:

            async def replay(seed: int) -> None:
                for i, prefix in enumerate(requests_of(conversation(seed, turns))):
                    url = urls[(i + seed) % len(urls)]  # round-robin, as the front would
                    statuses[await post(client, url, prefix, f"conversation-{seed}")] += 1

            await asyncio.gather(*(replay(seed) for seed in range(conversations)))
    changes = [len(seen) for seen in upstream.summaries.values()]
    return upstream.summary_calls, dict(statuses), statistics.mean(changes) if changes else 0.0


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        async with redis_server() as redis_url:
            backends: dict[str, dict[str, Any]] = {
                "memory": {"backend": "memory"},
                "sqlite": {"backend": "sqlite", "path": str(tmp / "state.sqlite3")},
            }
            if redis_url is not None:
                backends["redis"] = {"backend": "redis", "redis_url": redis_url}
            await hot_path(backends, args.requests, tmp)

            print(
                f"\n{args.conversations} conversations x {len(requests_of(conversation(0, args.turns)))}"
                " requests, round-robin across replicas (summary calls answer in 0.3 s):"
            )
            print(
                f"{'backend':>8} {'replicas':>9} {'summarizer calls':>17} {'applied':>8} {'reused':>7} {'summaries per conversation':>27}"
            )
            for name in ("memory", "redis"):
                if name not in backends:
                    continue
                for count in (1, 3):
                    if name == "redis":  # a clean Redis for each run
                        backends[name] = {**backends[name], "redis_url": redis_url}
                        await _flush(redis_url)
                    calls, statuses, changes = await replicas(
                        backends[name],
                        count,
                        args.conversations,
                        args.turns,
                        tmp / f"{name}{count}",
                    )
                    print(
                        f"{name:>8} {count:>9} {calls:>17} {statuses.get('applied', 0):>8}"
                        f" {statuses.get('reused', 0):>7} {changes:>27.1f}"
                    )


async def _flush(url: str | None) -> None:
    import redis.asyncio as aioredis

    if url is None:
        return
    client = aioredis.from_url(url)
    await client.flushall()
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="reused requests per backend")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=120, help="tool rounds per conversation")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
