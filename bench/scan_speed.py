"""How fast the ledger reads folded text: whole-text regexes against the per-token loop they replaced.

The baseline is the former path finder (split the text into tokens, then test each token in
Python), kept here verbatim in spirit; it runs on the same corpus prose in the same process.
Printed: best of three, milliseconds, and the ratio; then the whole ledger over every message of
the coding and airline conversations.

    .venv/bin/python -m bench.scan_speed
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.corpus import CORPUS_ENV, corpus_dir, has_corpus, read_corpus
from compaction import read_items
from compaction.ledger import build_ledger
from compaction.scan import CODE_EXTENSIONS, PATH_CHARS, find_paths, strip_fences

FILES = ("swe_mini_gemini3pro.jsonl", "tau_bench_airline_gpt4o.jsonl")
_TOKEN_SPLIT = re.compile(r"[\s'\"`;|&<>(){}\[\],=*!?]+")


def per_token_paths(text: str) -> list[str]:
    """The former finder: a Python test per token (the cost the regex rewrite removes)."""
    found: list[str] = []
    for raw in _TOKEN_SPLIT.split(text):
        token = raw.rstrip(".:;,)")
        if not token or "://" in token or not any(ch.isalpha() for ch in token):
            continue
        if len(token) > PATH_CHARS:
            continue
        if token.startswith(("/", "./", "../", "~/")):
            if len(token) > 1 and not token.startswith("//"):
                found.append(token)
            continue
        _, dot, extension = token.rpartition(".")
        if (dot and extension.lower() in CODE_EXTENSIONS) or token.strip("/").count("/") >= 2:
            found.append(token)
    return found


def best_ms(function: Callable[[Any], object], inputs: list[Any]) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for value in inputs:
            function(value)
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> int:
    if not has_corpus():
        print(f"corpus not found at {corpus_dir()} (set {CORPUS_ENV})", file=sys.stderr)
        return 2
    conversations = [
        read_items(row["messages"]) for name in FILES for row in read_corpus(corpus_dir() / name)
    ]
    prose = [strip_fences(item.text) for items in conversations for item in items if item.is_prose]
    chars = sum(map(len, prose))
    before, after = best_ms(per_token_paths, prose), best_ms(find_paths, prose)
    print(f"paths in {len(prose)} prose texts ({chars / 1e6:.1f} M chars):")
    print(
        f"  per-token loop {before:7.0f} ms   whole-text regex {after:7.0f} ms   {before / after:.1f}x"
    )
    ledger = best_ms(lambda items: build_ledger(items, range(len(items))), conversations)
    total = sum(len(item.text) for items in conversations for item in items)
    print(
        f"whole ledger (requests, trail, files, values) over {len(conversations)} conversations "
        f"({total / 1e6:.1f} M chars): {ledger:.0f} ms, {total / ledger / 1e3:.0f} M chars/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
