"""Where the shared replay corpus is, and how to read it: one place for tests and benchmarks.

The corpus lives beside the repository (../shared/corpus), never inside it; a user's clone may not
have it, so `COMPACTION_PROXY_CORPUS` can point elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

CORPUS_ENV = "COMPACTION_PROXY_CORPUS"
_DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "corpus"


def corpus_dir() -> Path:
    return Path(os.environ.get(CORPUS_ENV, _DEFAULT))


def has_corpus(path: Path | None = None) -> bool:
    return ((path or corpus_dir()) / "manifest.json").is_file()


def read_corpus(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the conversations of one corpus JSONL file."""
    with path.open("rb") as lines:
        for line in lines:
            if line.strip():
                yield orjson.loads(line)
