"""Fixtures shared by every test package: the replay corpus lives outside the repo."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from bench.corpus import CORPUS_ENV, has_corpus
from bench.corpus import corpus_dir as bench_corpus_dir

# Property tests must not fail on a loaded 2-core CI machine because one example ran slowly.
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The shared replay corpus (../shared/corpus, or $COMPACTION_PROXY_CORPUS).

    A user's clone has no ../shared; CI always has it. Tests that need it skip, saying why.
    """
    path = bench_corpus_dir()
    if not has_corpus(path):
        pytest.skip(f"replay corpus not found at {path} (set {CORPUS_ENV} to its folder)")
    return path
