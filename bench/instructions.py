"""Pass-through cost counted in CPU instructions: the proxy against the minimal forwarder.

    .venv/bin/python -m bench.instructions [--requests 300] [--sizes 2000,400000]

On a shared machine, req/s and CPU seconds of the same code move by tens of percent from one
run to the next (bench.wrk). The instructions a process executes for the same requests repeat
to within about 1%, so a change of a few microseconds per request shows. Each server runs
under valgrind's callgrind with counting off: warm-up requests first, then counting on
(`callgrind_control -i on`), `--requests` requests at concurrency 4, counting off, and the
totals read from the profile written at exit. Instructions per request are printed for:

- the ~40-line aiohttp forwarder of bench.passthrough (the baseline);
- the proxy with the default config (compaction on, JSON access line on);
- the same with the access line off (`logging.level: WARNING`), and with compaction off:
  the differences are what the access line and the compaction decision cost.

User-space instructions only: the kernel's work for the sockets is not counted (the proxy
makes no more socket calls per request than the forwarder). Needs valgrind (Debian:
`apt-get install -y valgrind`); benchmark-only, tests never use it. Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

from bench.passthrough import ROOT, chat_body, free_port, load, spawn, stop, wait_ready

CONCURRENCY = 4
WARM_UP = 100
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.M)


def has_valgrind() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


async def send(url: str, body: bytes, requests: int) -> None:
    async with aiohttp.ClientSession() as session:
        await load(session, url, body, CONCURRENCY, requests, session_id="instructions-bench")


async def count(args: list[str], port: int, body: bytes, requests: int, **env: str) -> float:
    """Instructions per request of the server `args` (listening on `port`) under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        process = subprocess.Popen(
            [
                *("valgrind", "--tool=callgrind", "--instr-atstart=no"),
                f"--callgrind-out-file={out}",
                *(sys.executable, *args),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            await _wait_under_valgrind(f"http://127.0.0.1:{port}/healthz")
            await send(url, body, WARM_UP)
            _control(process.pid, "-i", "on")
            await send(url, body, requests)
            _control(process.pid, "-i", "off")
        finally:
            stop([process])
        total = sum(int(n) for n in _TOTALS.findall(out.read_bytes()))
    return total / requests


def _control(pid: int, *args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args, str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _wait_under_valgrind(url: str) -> None:
    for _ in range(10):  # start-up under valgrind takes seconds, not milliseconds
        try:
            await wait_ready(url)
            return
        except RuntimeError:
            continue
    raise RuntimeError(f"{url} did not come up under valgrind")


async def instruction_figures(requests: int, sizes: list[int]) -> None:
    if not has_valgrind():
        print("instructions: valgrind is not installed (apt-get install -y valgrind); skipped")
        return
    up = free_port()
    upstream = spawn(["-m", "bench.passthrough", "serve-upstream", str(up)])
    base = f"http://127.0.0.1:{up}"
    memory = tempfile.TemporaryDirectory()
    proxy_env = {
        "COMPACTION_PROXY__MEMORY__DIR": memory.name,
        "COMPACTION_PROXY__STATE__BACKEND": "memory",
    }
    try:
        await wait_ready(f"{base}/healthz")
        print(
            f"pass-through instructions per request (callgrind, {requests} requests, c{CONCURRENCY})"
        )
        for size in sizes:
            body = chat_body(size)
            port = free_port()
            forwarder = ["-m", "bench.passthrough", "serve-baseline", str(port), base]
            proxy = [
                *("-m", "proxy", "--upstream", f"{base}/v1", "--port", str(port)),
                *("--config", str(ROOT / "config.yaml")),
            ]
            variants: list[tuple[str, list[str], dict[str, str]]] = [
                ("forwarder", forwarder, {}),
                ("proxy", proxy, proxy_env),
                (
                    "proxy, access line off",
                    proxy,
                    {**proxy_env, "COMPACTION_PROXY__LOGGING__LEVEL": "WARNING"},
                ),
                (
                    "proxy, compaction off",
                    proxy,
                    {**proxy_env, "COMPACTION_PROXY__COMPACTION__ENABLED": "false"},
                ),
            ]
            baseline = 0.0
            for name, args, env in variants:
                per_request = await count(args, port, body, requests, **env)
                baseline = baseline or per_request
                print(
                    f"    {size // 1000:>4} KB {name:<24} {per_request / 1000:8.0f}k "
                    f"({per_request / baseline:.2f}x the forwarder)"
                )
    finally:
        stop([upstream])
        memory.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions")
    parser.add_argument("--requests", type=int, default=300, help="counted requests per server")
    parser.add_argument(
        "--sizes", default="2000,400000", help="body sizes in bytes, comma-separated"
    )
    options = parser.parse_args()
    sizes = [int(size) for size in options.sizes.split(",")]
    asyncio.run(instruction_figures(options.requests, sizes))


if __name__ == "__main__":
    main()
