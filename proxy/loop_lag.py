"""The event loop's lag, measured: a timer that should fire every `interval_s`, and how late it
fires. Whatever delays it (CPU work on the loop) delays every request the same way, so the lag
is what an operator reads to know whether the loop only moves bytes."""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

INTERVAL_S = 0.05


async def watch_loop_lag(histogram: Histogram, interval_s: float = INTERVAL_S) -> None:
    """Observe the lag into `histogram` until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(interval_s)
        histogram.observe(max(0.0, loop.time() - started - interval_s))
