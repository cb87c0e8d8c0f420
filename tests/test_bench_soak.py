"""bench.soak: the proxy through its CLI with its worker, agents over the three APIs for 60 s (the
CI version of the 10-minute soak); and the verdict it prints, which fails on errors and on RSS
still rising at the end."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak import Tally, descendants, rss_kb, slope_kb_s, verdict

ROOT = Path(__file__).resolve().parents[1]

CI_SLOPE_KB = 4096
"""The RSS rise allowed over the last third of the 60 s run: a runaway (4 MB/s, ~15 GB an hour)
fails it. Whether RSS levels off is judged by the 10-minute bench at its own 64 KB/s, and today
it does not: the proxy still grows by about 1-1.5 KB per request once its caches are full
(issue #27 item 8 is open; docs/performance.md has the figures). Measured in this 60 s run on the
shared 2-CPU machine: 0.5-1.3 MB/s, warm-up and that growth together, so the 512 KB/s this test
first held failed on main under load."""


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
def test_a_one_minute_soak_has_no_error_and_no_runaway_rss() -> None:
    run = subprocess.run(
        [
            *(sys.executable, "-m", "bench.soak", "--seconds", "60", "--agents", "12"),
            *("--every", "5", "--max-slope-kb", str(CI_SLOPE_KB)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "errors 0 " in run.stdout and "PASS" in run.stdout
