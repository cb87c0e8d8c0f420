"""Pass-through throughput with a C load generator: the proxy against a minimal aiohttp forwarder.

    .venv/bin/python -m bench.wrk [--duration 4]      (also part of `python -m bench.hotpath`)

Needs `wrk` (Debian: `apt-get install -y wrk`; benchmark-only, tests never use it). Starts, each in
its own process, the fixed-answer upstream and the ~40-line aiohttp forwarder of bench.passthrough
and the proxy through its CLI with the default config (compaction on, JSON access log on). For a
2 KB body (never parsed) and a 400 KB body (~100k tokens: past precompute_ratio of a 128k window,
so parsed and estimated on every request) it runs wrk with 16 connections against the upstream
directly, the forwarder and the proxy, interleaved rounds (`--rounds`, 2), and prints req/s,
median latency, the median each adds over direct, the CPU each server process spent per request
(from /proc; steadier than req/s on a shared machine), and the proxy/forwarder ratios. Prints
figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.passthrough import chat_body, free_port, spawn, stop, wait_ready

CONNECTIONS = 16
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}
_LUA = """wrk.method = "POST"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.headers["X-Session-Id"] = "wrk-bench"
"""


@dataclass
class WrkResult:
    rps: float
    median_ms: float
    requests: int
    cpu_us: float = float("nan")
    """CPU (user + system) the server process spent per request during the run."""


def has_wrk() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(url: str, script: Path, duration_s: int) -> WrkResult:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{duration_s}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"\s50%\s+([\d.]+)(us|ms|s)\b", out).groups()  # type: ignore[union-attr]
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors from {url}:\n{out}")
    return WrkResult(rps, float(value) * _UNITS[unit], requests)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured_run(url: str, script: Path, duration_s: int, pid: int | None) -> WrkResult:
    """`run_wrk`, with the CPU `pid` (the server measured) spent per request."""
    before = cpu_seconds(pid) if pid is not None else 0.0
    result = run_wrk(url, script, duration_s)
    if pid is not None and result.requests:
        result.cpu_us = (cpu_seconds(pid) - before) / result.requests * 1e6
    return result


async def passthrough_figures(duration_s: int = 4, rounds_n: int = 2) -> None:
    if not has_wrk():
        print("(d) pass-through: wrk is not installed (apt-get install -y wrk); skipped")
        return
    root = Path(__file__).resolve().parents[1]
    up, fwd, prx = free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up}"
    memory = tempfile.TemporaryDirectory()
    processes = [
        spawn(["-m", "bench.passthrough", "serve-upstream", str(up)]),
        spawn(["-m", "bench.passthrough", "serve-baseline", str(fwd), upstream]),
        spawn(
            [
                *("-m", "proxy", "--upstream", f"{upstream}/v1", "--port", str(prx)),
                *("--config", str(root / "config.yaml")),
            ],
            COMPACTION_PROXY__MEMORY__DIR=memory.name,
        ),
    ]
    targets = {
        "direct": f"{upstream}/v1/chat/completions",
        "forwarder": f"http://127.0.0.1:{fwd}/v1/chat/completions",
        "proxy": f"http://127.0.0.1:{prx}/v1/chat/completions",
    }
    # The server each target measures: the upstream, the forwarder, the proxy.
    pids = dict(zip(targets, (process.pid for process in processes), strict=True))
    try:
        for url in targets.values():
            await wait_ready(url.replace("/v1/chat/completions", "/healthz"))
        print(f"(d) pass-through, wrk -t1 -c{CONNECTIONS} -d{duration_s}s, {rounds_n} rounds each")
        print(
            f"    {'body':>7} {'target':>9} {'req/s':>8} {'median ms':>10} {'added ms':>9} "
            f"{'CPU us/req':>10}"
        )
        with tempfile.TemporaryDirectory() as tmp:
            for size in (2_000, 400_000):
                body_file, script = Path(tmp) / f"body{size}", Path(tmp) / f"post{size}.lua"
                body_file.write_bytes(chat_body(size))
                script.write_text(_LUA.format(body=body_file))
                for url in targets.values():  # warm pools, caches and the proxy's precompute
                    run_wrk(url, script, 1)
                rounds: dict[str, list[WrkResult]] = {name: [] for name in targets}
                for _ in range(rounds_n):
                    for name, url in targets.items():
                        rounds[name].append(measured_run(url, script, duration_s, pids[name]))
                _report(size, rounds)
    finally:
        stop(processes)
        memory.cleanup()


def _report(size: int, rounds: dict[str, list[WrkResult]]) -> None:
    rps = {name: statistics.mean(r.rps for r in got) for name, got in rounds.items()}
    med = {name: statistics.mean(r.median_ms for r in got) for name, got in rounds.items()}
    cpu = {name: statistics.median(r.cpu_us for r in got) for name, got in rounds.items()}
    added = {name: med[name] - med["direct"] for name in rounds}
    for name in rounds:
        shown = "" if name == "direct" else f"{added[name]:9.3f}"
        print(
            f"    {size // 1000:>4} KB {name:>9} {rps[name]:8.0f} {med[name]:10.3f} {shown:>9} "
            f"{cpu[name]:10.0f}"
        )
    target = 0.9 if size < 100_000 else 0.8
    ratio = added["proxy"] / added["forwarder"] if added["forwarder"] > 0 else float("nan")
    print(
        f"    {size // 1000:>4} KB proxy/forwarder: req/s {rps['proxy'] / rps['forwarder']:.2f}x "
        f"(target >= {target}x), added median {ratio:.2f}x (target <= 1.3x), "
        f"CPU per request {cpu['proxy'] / cpu['forwarder']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wrk")
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved runs per target")
    options = parser.parse_args()
    asyncio.run(passthrough_figures(options.duration, options.rounds))


if __name__ == "__main__":
    main()
