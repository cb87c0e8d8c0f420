"""Cooldown: after repeated summarizer failures, stop calling the LLM for a while.

Consecutive failures per key (the summary model and the caller's credentials, so one tenant's bad
key cools only its own calls) open the cooldown; while it is open the caller uses the library's
fallback path. One success closes it. Failures a day old are forgotten (as Redis expires its
counter), and only the most recently failing keys are kept, so tenants x models stay bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from cachetools import LRUCache

FORGET_FAILURES_AFTER_S = 86400.0
MAX_KEYS = 10_000


class CooldownState(NamedTuple):
    """What a persistent store keeps of one key."""

    failures: int
    failed_at: float
    until: float | None


class Cooldown:
    def __init__(
        self,
        threshold: int,
        cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._keys: LRUCache[str, CooldownState] = LRUCache(max_keys)

    def is_cooling(self, key: str) -> bool:
        state = self._keys.get(key)
        if state is None or state.until is None:
            return False
        if self._clock() >= state.until:
            del self._keys[key]
            return False
        return True

    def record(self, key: str, *, ok: bool) -> None:
        if ok:
            self._keys.pop(key, None)
            return
        now = self._clock()
        failures = 1
        state = self._keys.get(key)
        if state is not None and self._counts(state, now):
            failures = state.failures + 1
        until = now + self._cooldown_s if failures >= self._threshold else None
        self._keys[key] = CooldownState(failures, now, until)

    def state_of(self, key: str) -> CooldownState | None:
        """What a persistent store keeps of `key`; None when nothing is left to keep."""
        return self._keys.get(key)

    def restore(self, key: str, state: CooldownState) -> None:
        """Take back what `state_of` gave, e.g. after a restart (on the same clock)."""
        if self._counts(state, self._clock()):
            self._keys[key] = state

    def _counts(self, state: CooldownState, now: float) -> bool:
        """False once its cooldown is over, or its last failure is a day old."""
        if state.until is not None:
            return now < state.until
        return now - state.failed_at < FORGET_FAILURES_AFTER_S
