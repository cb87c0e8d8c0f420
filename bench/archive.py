"""What the archive of folded turns costs: search latency in a large session, and size on disk.

Corpus conversations (chat dialect) are archived into one session of a fresh SQLite state file,
a thousand messages at a time as compactions would, until it holds `--messages` (100k). Then
`--queries` searches, each of two or three words taken from an archived message (a model asking
for something it once saw), are timed through the archive's own thread as the proxy calls it.
Printed: search p50 and p99 (target: p50 <= 5 ms at 100k), wall-clock and the process's CPU time
(on a loaded machine the wall clock mostly measures waiting for a core), the time to archive, and
the state file's size per million folded tokens (the library's estimate).

    .venv/bin/python -m bench.archive [--messages 100000] [--queries 300] [--limit 10]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.corpus import corpus_dir, has_corpus, read_corpus
from compaction import CHAT, HeuristicEstimator
from proxy.compacting.background.archiving import build_entries
from proxy.state.archive import Scope
from proxy.state.archive.sqlite import SqliteArchive
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()
    if not has_corpus():
        raise SystemExit(f"no corpus at {corpus_dir()} (set COMPACTION_PROXY_CORPUS)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
