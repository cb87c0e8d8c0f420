"""bench.soak: the proxy through its CLI with its worker, agents over the three APIs for 60 s (the
CI version of the 10-minute soak, its caches bounded to what a minute fills); and the verdict it
prints, which fails on errors and on RSS still rising at the end."""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak import Tally, descendants, rss_kb, slope_kb_s, state_verdict, verdict

ROOT = Path(__file__).resolve().parents[1]

CI_SLOPE_KB = 640
"""The RSS rise allowed over the last third of the 60 s run. At the default bounds the caches
take about three minutes to fill (docs/operations.md#memory-budget), so this run bounds them to
what a minute fills (CI_BOUNDS) and gives the freed memory back every 5 s instead of 30: then
RSS must have levelled off by its last third. Measured on the shared 2-CPU machine: 85 KB/s
(load average 4), 171 KB/s (load 9; the tail of the warm-up), 425 KB/s once on a clean clone
(a 20 s fit over four samples moves that much); at the default bounds, with the caches still
filling, 0.8-1.4 MB/s. Without the heap trim it measured 390 KB/s and more: within this bound,
so the trim is proven by the 10-minute soak (docs/performance.md), not by this run."""

CI_BOUNDS = (
    "compaction.known_requests_mb=4",
    "compaction.known_requests=20",
    "compaction.checkpoint_max_entries=100",
    "admin.max_sessions=20",
    "admin.max_records_mb=2",
    "memory.max_sessions=20",
    "memory.cached_items=400",
    "state.cached_checkpoints=100",
    "server.heap_trim_s=5",
)


def options(max_slope_kb: float = 64) -> argparse.Namespace:
    return argparse.Namespace(max_slope_kb=max_slope_kb)


def test_the_slope_is_the_least_squares_fit_in_kb_per_second() -> None:
    assert slope_kb_s([(0.0, 100), (10.0, 200), (20.0, 300)]) == pytest.approx(10.0)
    assert slope_kb_s([(0.0, 100)]) == 0.0


def test_the_verdict_fails_on_an_error_or_on_rss_still_rising(
    capsys: pytest.CaptureFixture[str],
) -> None:
    level = [(t * 10.0, 100_000 + (5_000 if t else 0)) for t in range(10)]
    rising = [(t * 10.0, 100_000 + 1_000 * t) for t in range(10)]  # 100 KB/s to the end
    assert verdict(options(), level, Tally(), logged_errors=0) == 0
    assert verdict(options(), rising, Tally(), logged_errors=0) == 1
    assert verdict(options(max_slope_kb=150), rising, Tally(), logged_errors=0) == 0
    failed = Tally()
    failed.error("status 502")
    assert verdict(options(), level, failed, logged_errors=0) == 1
    assert verdict(options(), level, Tally(), logged_errors=1) == 1
    assert "FAIL" in capsys.readouterr().out


def test_rss_and_descendants_come_from_proc() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants(os.getpid())
        assert rss_kb(child.pid) > 1000
    finally:
        child.kill()
        child.wait()
    assert rss_kb(child.pid) == 0


@pytest.mark.timeout(150)
def test_a_one_minute_soak_has_no_error_and_rss_levels_off_once_the_caches_are_full() -> None:
    run = subprocess.run(
        [
            *(sys.executable, "-m", "bench.soak", "--seconds", "60", "--agents", "12"),
            *("--every", "5", "--max-slope-kb", str(CI_SLOPE_KB)),
            *(arg for bound in CI_BOUNDS for arg in ("--set", bound)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "errors 0 " in run.stdout and "PASS" in run.stdout


def test_the_state_verdict_fails_when_the_file_is_over_the_archive_bound_and_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "state.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE archive (body BLOB)")
        connection.execute("CREATE TABLE checkpoints (body BLOB)")
        connection.execute("INSERT INTO archive VALUES (zeroblob(1048576))")
        connection.execute("INSERT INTO checkpoints VALUES (zeroblob(524288))")
    size = path.stat().st_size
    bounded = argparse.Namespace(set=["archive.max_total_mb=1.1"])
    assert state_verdict(bounded, [(0.0, 0), (10.0, size)], path, sessions=3) == 0
    assert "archive 1.0" in capsys.readouterr().out
    over = [(0.0, 0), (10.0, size + 2 * 2**20)]  # a file larger than its pages say
    assert state_verdict(bounded, over, path, sessions=3) == 1
    assert "FAIL" in capsys.readouterr().out
    assert state_verdict(argparse.Namespace(set=[]), over, path, sessions=3) == 0
