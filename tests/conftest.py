"""Fixtures shared by every test package: the replay corpus lives outside the repo."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, settings

# Property tests must not fail on a loaded 2-core CI machine because one example ran slowly.
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

CORPUS_ENV = "COMPACTION_PROXY_CORPUS"
_DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The shared replay corpus (../shared/corpus, or $COMPACTION_PROXY_CORPUS).

    A user's clone has no ../shared; CI always has it. Tests that need it skip, saying why.
    """
    path = Path(os.environ.get(CORPUS_ENV, _DEFAULT_CORPUS))
    if not (path / "manifest.json").is_file():
        pytest.skip(f"replay corpus not found at {path} (set {CORPUS_ENV} to its folder)")
    return path


def read_corpus(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the conversations of one corpus JSONL file."""
    with path.open("rb") as lines:
        for line in lines:
            if line.strip():
                yield orjson.loads(line)
