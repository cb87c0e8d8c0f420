"""Decompression bombs against a real proxy process: what one small encoded request body that
decodes to gigabytes costs everyone else.

For each content coding (br, gzip, zstd) and each route kind (a compacted route,
`/v1/chat/completions`, and a route that takes no body, `/healthz`), a fresh
`python -m proxy` (default settings: `server.max_body_mb: 64`) gets one bomb while a client asks
`/healthz` again and again, during the bomb and for two seconds after its answer (aiohttp's
lingering drain of an unread body runs after the answer). Printed per run: the bomb's size, its
status and answer time, the worst `/healthz` latency, and the proxy's RSS rise (its peak,
VmHWM, over its RSS before the bomb). Targets: `/healthz` never slower than 0.5 s, RSS rise under
128 MB.

    .venv/bin/python -m bench.bombs [--gib 2] [--encodings br,gzip,zstd]

The proxy is imported as Python finds it: `PYTHONPATH=/path/to/other/checkout` measures another
tree with the same bench.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import socket
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import aiohttp
import brotli
from backports import zstd

_BLOCK = 1 << 24  # 16 MiB of zeros: the unit a bomb repeats
TARGET_HEALTHZ_S = 0.5
TARGET_RSS_MB = 128


def bomb(encoding: str, decoded_bytes: int) -> bytes:
    """A body in `encoding` that decodes to `decoded_bytes` zeros (a multiple of 16 MiB), built
    in a fraction of a second and never held decoded: each coder is flushed after every 16 MiB
    block, which leaves it in the same state, so one block's output is repeated instead of
    compressing gigabytes (gzip's trailer checksum is computed over the zeros piece by piece)."""
    blocks = max(1, decoded_bytes // _BLOCK)
    zeros = bytes(_BLOCK)
    if encoding == "br":
        brotli_coder = brotli.Compressor(quality=5, lgwin=24)
        return _repeated(blocks, lambda: brotli_coder.process(zeros) + brotli_coder.flush(),
                         brotli_coder.finish)  # fmt: skip
    if encoding == "zstd":
        zstd_coder = zstd.ZstdCompressor(level=3)
        return _repeated(
            blocks,
            lambda: zstd_coder.compress(zeros) + zstd_coder.flush(zstd.ZstdCompressor.FLUSH_BLOCK),
            lambda: zstd_coder.flush(zstd.ZstdCompressor.FLUSH_FRAME),
        )
    if encoding == "gzip":
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the header is ours
        body = _repeated(
            blocks, lambda: deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH),
            lambda: deflate.flush(zlib.Z_FINISH),
        )  # fmt: skip
        crc = 0
        for _ in range(blocks):
            crc = zlib.crc32(zeros, crc)
        size = (blocks * _BLOCK) & 0xFFFFFFFF
        header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
        return header + body + crc.to_bytes(4, "little") + size.to_bytes(4, "little")
    raise ValueError(f"no bomb for {encoding!r}")


def _repeated(blocks: int, step: Callable[[], bytes], finish: Callable[[], bytes]) -> bytes:
    """The coder's output for `blocks` steps: the first two are coded (the first carries the
    stream's header, the second is what every later one repeats), the rest copied."""
    first = step()
    if blocks == 1:
        return first + finish()
    again = step()
    return first + again * (blocks - 1) + finish()


@dataclass
class Run:
    encoding: str
    path: str
    bomb_bytes: int
    status: int
    answer_s: float
    worst_healthz_s: float
    healthz_answered: int
    rss_rise_mb: float


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


async def _start_proxy(folder: str) -> tuple[asyncio.subprocess.Process, str]:
    port = _free_port()
    env = {
        **os.environ,
        "COMPACTION_PROXY__STATE__BACKEND": "memory",
        "COMPACTION_PROXY__MEMORY__DIR": os.path.join(folder, "memory"),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "--host", "127.0.0.1", "--port", str(port),
        "--upstream", "http://127.0.0.1:9/v1",
        env=env, cwd=folder, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(f"{url}/healthz") as response:
                    if response.status == 200:
                        return process, url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    process.kill()
    raise RuntimeError("the proxy did not start")


async def _poll_healthz(url: str, stop: asyncio.Event) -> tuple[float, int]:
    """Worst latency of `/healthz` asked back to back (each on a fresh connection, as a load
    balancer's probe) until `stop`, and how many answered."""
    worst, answered = 0.0, 0
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),
        timeout=aiohttp.ClientTimeout(total=30),
    ) as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(f"{url}/healthz") as response:
                await response.read()
                answered += response.status == 200
            worst = max(worst, time.perf_counter() - started)
            await asyncio.sleep(0.01)
    return worst, answered


async def measure(encoding: str, path: str, body: bytes, after_s: float = 2.0) -> Run:
    with tempfile.TemporaryDirectory() as folder:
        process, url = await _start_proxy(folder)
        try:
            await asyncio.sleep(0.3)
            before_kb = _status_kb(process.pid, "VmRSS")
            stop = asyncio.Event()
            poller = asyncio.create_task(_poll_healthz(url, stop))
            await asyncio.sleep(0.1)
            started = time.perf_counter()
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=120), auto_decompress=False
            ) as session:
                method = "POST" if path.startswith("/v1/") else "GET"
                try:
                    async with session.request(
                        method, f"{url}{path}", data=io.BytesIO(body),
                        headers={"Content-Encoding": encoding,
                                 "Content-Type": "application/json"},
                    ) as response:  # fmt: skip
                        await response.read()
                        status = response.status
                except aiohttp.ClientError:
                    status = 0
            answer_s = time.perf_counter() - started
            await asyncio.sleep(after_s)
            stop.set()
            worst, answered = await poller
            peak_kb = _status_kb(process.pid, "VmHWM")
        finally:
            process.terminate()
            await process.wait()
    return Run(encoding, path, len(body), status, answer_s, worst, answered,
               (peak_kb - before_kb) / 1024)  # fmt: skip


def runs(encodings: list[str], decoded_bytes: int) -> Iterator[tuple[str, str, bytes]]:
    for encoding in encodings:
        body = bomb(encoding, decoded_bytes)
        for path in ("/v1/chat/completions", "/healthz"):
            yield encoding, path, body


async def _main(encodings: list[str], gib: float) -> None:
    decoded = int(gib * (1 << 30))
    print(f"bombs decoding to {gib:g} GiB; targets: /healthz <= {TARGET_HEALTHZ_S} s, "
          f"RSS rise < {TARGET_RSS_MB} MB")  # fmt: skip
    header = f"{'coding':6} {'route':22} {'bytes':>8} {'status':>6} {'answer s':>9} "
    print(header + f"{'worst healthz s':>16} {'healthz ok':>10} {'RSS rise MB':>12}")
    for encoding, path, body in runs(encodings, decoded):
        run = await measure(encoding, path, body)
        print(f"{run.encoding:6} {run.path:22} {run.bomb_bytes:>8} {run.status:>6} "
              f"{run.answer_s:>9.2f} {run.worst_healthz_s:>16.3f} {run.healthz_answered:>10} "
              f"{run.rss_rise_mb:>12.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bombs")
    parser.add_argument("--gib", type=float, default=2.0, help="decoded size of each bomb")
    parser.add_argument("--encodings", default="br,gzip,zstd")
    args = parser.parse_args()
    asyncio.run(_main(args.encodings.split(","), args.gib))


if __name__ == "__main__":
    main()
