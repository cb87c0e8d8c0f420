"""The small pieces the compacting hook is built from: single-flight, cooldown, calibration and
overflow recognition."""

from __future__ import annotations

import asyncio

import pytest

from proxy.compacting.background.flight import SingleFlight, wait_shielded
from proxy.compacting.models.calibration import Calibration
from proxy.compacting.models.overflow import parse_overflow
from proxy.state.cooldown import Cooldown
from proxy.tasks import BackgroundTasks


async def test_single_flight_runs_the_work_once_for_concurrent_callers() -> None:
    tasks = BackgroundTasks()
    flight: SingleFlight[str, int] = SingleFlight(tasks)
    calls = 0
    release = asyncio.Event()

    async def work() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return 42

    waiters = [flight.start("k", work, name="w") for _ in range(10)]
    assert flight.find(["other", "k"]) is waiters[0]
    release.set()
    assert await asyncio.gather(*waiters) == [42] * 10
    assert calls == 1
    assert len(flight) == 0 and flight.find(["k"]) is None
    await tasks.close()


async def test_a_caller_that_gives_up_does_not_cancel_the_shared_work() -> None:
    tasks = BackgroundTasks()
    flight: SingleFlight[str, str] = SingleFlight(tasks)
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "done"

    task = flight.start("k", slow, name="slow")
    with pytest.raises(TimeoutError):
        await wait_shielded(task, 0.01)
    assert not task.done()
    release.set()
    assert await task == "done"
    await tasks.close()


def test_cooldown_opens_after_consecutive_failures_and_closes_after_the_period() -> None:
    now = [0.0]
    cooldown = Cooldown(threshold=3, cooldown_s=10, clock=lambda: now[0])
    cooldown.record("m", ok=False)
    cooldown.record("m", ok=False)
    assert not cooldown.is_cooling("m")
    cooldown.record("m", ok=False)
    assert cooldown.is_cooling("m")
    assert not cooldown.is_cooling("other-model")
    now[0] = 10.5
    assert not cooldown.is_cooling("m")
    # A success in between resets the count.
    cooldown.record("m", ok=False)
    cooldown.record("m", ok=True)
    cooldown.record("m", ok=False)
    cooldown.record("m", ok=False)
    assert not cooldown.is_cooling("m")


def test_calibration_moves_towards_observed_ratio_and_is_clamped() -> None:
    calibration = Calibration()
    assert calibration.factor("gpt") == 1.0
    assert calibration.observe("gpt", 1000, 1200) == pytest.approx(1.2)
    assert calibration.observe("gpt", 1000, 1200) == pytest.approx(1.2)
    moved = calibration.observe("gpt", 1000, 2200)
    assert 1.2 < moved < 2.2
    assert calibration.observe("tiny", 10, 10_000) == 4.0
    assert calibration.observe("generous", 10_000, 10) == 0.8
    assert calibration.raise_at_least("gpt", 1.0) == moved
    assert calibration.raise_at_least("gpt", 3.0) == 3.0
    assert calibration.observe("gpt", 0, 5) == 3.0


@pytest.mark.parametrize(
    ("status", "body", "limit", "requested"),
    [
        (
            400,
            b'{"error": {"message": "This model\'s maximum context length is 8,192 tokens. '
            b'However, your messages resulted in 9,500 tokens.", "type": "invalid_request_error",'
            b' "code": "context_length_exceeded"}}',
            8192,
            9500,
        ),
        (
            400,
            b'{"error": {"message": "This model\'s maximum context length is 8192 tokens. However, you '
            b'requested 9000 tokens (8000 tokens in the messages, 1000 tokens in the completion).", '
            b'"code": "context_length_exceeded"}}',
            8192,
            8000,
        ),
        (400, b'{"error": {"message": "x", "code": "context_length_exceeded"}}', None, None),
        (
            400,
            b'{"error": {"message": "prompt is too long: 210000 tokens > 200000 maximum"}}',
            200000,
            210000,
        ),
        (
            400,
            b'{"type": "error", "error": {"type": "invalid_request_error", "message": "input length'
            b" and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input "
            b'length or `max_tokens` and try again"}}',
            200000,
            188240,
        ),
        (413, b"Request exceeds the maximum context window", None, None),
        (400, b'{"detail": "This model\'s maximum context length is 4096 tokens"}', 4096, None),
    ],
)
def test_overflow_errors_are_recognised(
    status: int, body: bytes, limit: int | None, requested: int | None
) -> None:
    overflow = parse_overflow(status, body)
    assert overflow is not None
    assert (overflow.limit, overflow.requested) == (limit, requested)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, b'{"error": {"message": "Invalid value for temperature", "code": "invalid_value"}}'),
        (
            401,
            b'{"error": {"message": "maximum context length", "code": "context_length_exceeded"}}',
        ),
        (400, b"not json at all"),
        (400, b"[1, 2]"),
    ],
)
def test_other_errors_are_not_overflows(status: int, body: bytes) -> None:
    assert parse_overflow(status, body) is None
