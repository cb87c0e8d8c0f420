"""What the archive of folded turns costs: search latency in a large session, and size on disk.

Corpus conversations (chat dialect) are archived into one session of a fresh SQLite state file,
a thousand messages at a time as compactions would, until it holds `--messages` (100k). Then
`--queries` searches, each of two or three words taken from an archived message (a model asking
for something it once saw), are timed through the archive's own thread as the proxy calls it.
Printed: search p50 and p99 (target: p50 <= 5 ms at 100k), wall-clock and the process's CPU time
(on a loaded machine the wall clock mostly measures waiting for a core), the time to archive, and
the state file's size per million folded tokens (the library's estimate).

With `--sessions N`: N compacted sessions instead, each archiving `--turns` corpus messages in
four compactions (as a session of four compactions does), into the state file or, with
`--backend redis`, into a redis-server of its own (`--maxmemory`, `volatile-lru`, as the issue's
setup). `--max-total-mb` is `archive.max_total_mb` (0: unbounded). Every 50 sessions a row: the
state file's size (or Redis's used memory), the sessions still archived; at the end the size per
session, the p50 of an archive write and the longest the event loop was held during one (what a
compacting request waits for behind it), and whether the newest session is still found.

    .venv/bin/python -m bench.archive [--messages 100000] [--queries 300] [--limit 10]
    .venv/bin/python -m bench.archive --sessions 500 --max-total-mb 8 [--backend redis]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.corpus import corpus_dir, has_corpus, read_corpus
from bench.state import redis_server
from compaction import CHAT, HeuristicEstimator
from proxy.compacting.background.archiving import build_entries
from proxy.state.archive import Archive, Scope
from proxy.state.archive.redis import RedisArchive
from proxy.state.archive.sqlite import SqliteArchive
from proxy.state.redis_client import RedisClient
from proxy.state.sqlite_file import StateFile

_FILES = ("swe_gym_openhands.jsonl", "swe_mini_gemini3pro.jsonl", "tau_bench_airline_gpt4o.jsonl")
_BATCH = 1000
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
SCOPE = Scope("bench-session", "ab" * 16)


def corpus_messages() -> Iterator[dict[str, Any]]:
    """Every chat message of the corpus files, over and over."""
    while True:
        for name in _FILES:
            for conversation in read_corpus(corpus_dir() / name):
                yield from conversation["messages"]


def queries_from(texts: list[str], count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    queries: list[str] = []
    while len(queries) < count:
        words = _WORD.findall(rng.choice(texts))
        if len(words) >= 3:
            start = rng.randrange(len(words) - 2)
            queries.append(" ".join(words[start : start + rng.choice((2, 3))]))
    return queries


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def run(args: argparse.Namespace) -> None:
    estimator = HeuristicEstimator()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.sqlite3"
        # Unbounded for the measure: the default bound (64 MB) would keep fewer messages.
        archive = SqliteArchive(StateFile(path), max_bytes=1 << 40, max_age_s=1e9)
        await archive.open()
        messages = corpus_messages()
        tokens = 0
        texts: list[str] = []
        started = time.perf_counter()
        for start in range(0, args.messages, _BATCH):
            batch = [next(messages) for _ in range(min(_BATCH, args.messages - start))]
            tokens += sum(estimator.count_message(message) for message in batch)
            entries = build_entries(
                batch, CHAT, start=start, dialect="chat", compaction_id=f"c{start}", at=time.time()
            )
            texts.extend(entry.text for entry in entries[:: max(1, len(entries) // 20)])
            await archive.add(SCOPE, entries)
        archiving_s = time.perf_counter() - started
        queries = queries_from(texts, args.queries)
        for query in queries[:20]:  # warm the page cache as a running proxy's would be
            await archive.search(SCOPE.session, query, tenant=SCOPE.tenant, limit=args.limit)
        timings: list[float] = []
        cpu: list[float] = []
        hits = 0
        for query in queries:
            began, began_cpu = time.perf_counter(), time.process_time()
            found = await archive.search(
                SCOPE.session, query, tenant=SCOPE.tenant, limit=args.limit
            )
            timings.append((time.perf_counter() - began) * 1000)
            cpu.append((time.process_time() - began_cpu) * 1000)
            hits += bool(found)
        await archive.close()
        size = sum(p.stat().st_size for p in Path(folder).iterdir() if p.name.startswith(path.name))
    per_million = size / (tokens / 1e6) / 1e6
    print(f"archive (sqlite, FTS5: {archive.full_text}): {args.messages} messages in one session")
    print(f"  folded tokens (estimate)      {tokens / 1e6:.1f} M")
    print(
        f"  archiving                     {archiving_s:.1f} s ({args.messages / archiving_s:.0f} msg/s)"
    )
    print(
        f"  search p50 / p99 (ms)         {statistics.median(timings):.2f} / {percentile(timings, 0.99):.2f}"
        f"  over {len(queries)} queries, limit {args.limit}, {hits} with results"
    )
    print(f"  search CPU p50 / p99 (ms)     {statistics.median(cpu):.2f} / {percentile(cpu, 0.99):.2f}"
          "  (the process's CPU time: what a search costs on an idle machine)")  # fmt: skip
    print(
        f"  state file                    {size / 1e6:.0f} MB: {per_million:.1f} MB per million folded tokens"
    )


async def loop_held(held: list[float]) -> None:
    """Record how late each tick of the event loop comes (what a request would wait)."""
    while True:
        began = time.perf_counter()
        await asyncio.sleep(0.001)
        held.append(time.perf_counter() - began - 0.001)


async def archive_sessions(args: argparse.Namespace) -> None:
    """`--sessions`: many compacted sessions, the archive's size as they come."""
    bound = int(args.max_total_mb * 2**20) if args.max_total_mb else None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.sqlite3"
        options = ("--maxmemory", f"{args.maxmemory_mb}mb", "--maxmemory-policy", "volatile-lru")
        async with redis_server(*options) as url:
            archive: Archive
            client: RedisClient | None = None
            if args.backend == "redis":
                if url is None:
                    raise SystemExit("--backend redis needs redis-server on PATH")
                client = RedisClient(url, timeout_s=5, max_connections=8)
                archive = RedisArchive(client, max_bytes=64 << 20, max_age_s=1e9,
                                       max_total_bytes=bound)  # fmt: skip
            else:
                archive = SqliteArchive(StateFile(path), max_bytes=64 << 20, max_age_s=1e9,
                                        max_total_bytes=bound)  # fmt: skip
            await archive.open()

            async def size() -> int:
                if client is None:
                    return path.stat().st_size
                return int((await client.get().info("memory"))["used_memory"])

            async def kept() -> int:
                """The sessions still archived."""
                if client is None:
                    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as reader:
                        return int(
                            reader.execute("SELECT count(*) FROM archive_sizes").fetchone()[0]
                        )
                return int(await client.get().zcard("compaction-proxy:archive:scopes"))

            base = await size() if client is not None else 0
            messages = corpus_messages()
            next(messages)  # the corpus read before the clock starts
            writes: list[float] = []
            held: list[float] = []
            ticker = asyncio.create_task(loop_held(held))
            per = max(1, args.turns // 4)
            print(f"{args.backend}, archive.max_total_mb {args.max_total_mb or 'unbounded'}:")
            print(f"{'sessions':>8} {'MiB':>8} {'kept':>6}")
            for number in range(args.sessions):
                for compaction in range(4):
                    batch = [next(messages) for _ in range(per)]
                    # In a thread, as the proxy builds them (proxy.compacting.background).
                    entries = await asyncio.to_thread(
                        build_entries, batch, CHAT, start=compaction * per, dialect="chat",
                        compaction_id=f"c{number}-{compaction}", at=time.time(),
                    )  # fmt: skip
                    began = time.perf_counter()
                    await archive.add(Scope(f"session-{number}", "ab" * 16), entries)
                    writes.append(time.perf_counter() - began)
                if (number + 1) % 50 == 0:
                    print(f"{number + 1:>8} {(await size() - base) / 2**20:8.2f} {await kept():>6}")
            ticker.cancel()
            used, still = await size() - base, await kept()
            newest = await archive.search(
                f"session-{args.sessions - 1}", "the", tenant=None, limit=1
            )
            await archive.close()
    print(f"  per session still archived: {used / max(1, still) / 1024:.0f} KiB ({still} of them)")
    print(f"  archive write p50 / p99: {statistics.median(writes) * 1000:.1f} /"
          f" {percentile(writes, 0.99) * 1000:.1f} ms; event loop held at most"
          f" {max(held, default=0) * 1000:.1f} ms (p99 {percentile(held, 0.99) * 1000:.1f})")  # fmt: skip
    print(f"  the newest session found: {bool(newest)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=0, help="compacted sessions instead")
    parser.add_argument("--turns", type=int, default=100, help="archived per session (100)")
    parser.add_argument("--max-total-mb", type=float, default=0, help="0: unbounded")
    parser.add_argument("--backend", choices=["sqlite", "redis"], default="sqlite")
    parser.add_argument("--maxmemory-mb", type=int, default=64, help="Redis's (64)")
    args = parser.parse_args()
    if not has_corpus():
        raise SystemExit(f"no corpus at {corpus_dir()} (set COMPACTION_PROXY_CORPUS)")
    asyncio.run(archive_sessions(args) if args.sessions else run(args))


if __name__ == "__main__":
    main()
