"""The summarizer's cooldown keeps what it needs and no more: failures a day old are forgotten,
and only the most recently failing keys are remembered."""

from __future__ import annotations

from proxy.state.cooldown import FORGET_FAILURES_AFTER_S, Cooldown


def test_failures_a_day_old_no_longer_count_towards_a_cooldown() -> None:
    now = [0.0]
    cooldown = Cooldown(threshold=3, cooldown_s=10, clock=lambda: now[0])
    cooldown.record("m", ok=False)
    cooldown.record("m", ok=False)
    now[0] += FORGET_FAILURES_AFTER_S
    cooldown.record("m", ok=False)
    assert not cooldown.is_cooling("m")
    cooldown.record("m", ok=False)
    cooldown.record("m", ok=False)
    assert cooldown.is_cooling("m")


def test_only_the_most_recently_failing_keys_are_remembered() -> None:
    cooldown = Cooldown(threshold=2, cooldown_s=10, clock=lambda: 0.0, max_keys=2)
    for key in ("old", "newer", "newest"):
        cooldown.record(key, ok=False)
    assert cooldown.state_of("old") is None
    assert cooldown.state_of("newer") is not None and cooldown.state_of("newest") is not None


def test_a_cooldown_that_ended_starts_the_count_again() -> None:
    now = [0.0]
    cooldown = Cooldown(threshold=2, cooldown_s=10, clock=lambda: now[0])
    cooldown.record("m", ok=False)
    cooldown.record("m", ok=False)
    now[0] = 11
    cooldown.record("m", ok=False)
    assert not cooldown.is_cooling("m")
