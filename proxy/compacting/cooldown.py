"""Cooldown: after repeated summarizer failures, stop calling the LLM for a while.

Consecutive failures per key (the summary model and the caller's credentials, so one tenant's bad
key cools only its own calls) open the cooldown; while it is open the caller uses the library's
fallback path. One success closes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Cooldown:
    def __init__(
        self, threshold: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}

    def is_cooling(self, key: str) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[key]
            self._failures[key] = 0
            return False
        return True

    def record(self, key: str, *, ok: bool) -> None:
        if ok:
            self._failures.pop(key, None)
            self._until.pop(key, None)
            return
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        if failures >= self._threshold:
            self._until[key] = self._clock() + self._cooldown_s

    def state_of(self, key: str) -> tuple[int, float | None]:
        """(consecutive failures, end of the cooldown or None): what a persistent store keeps."""
        return self._failures.get(key, 0), self._until.get(key)

    def restore(self, key: str, failures: int, until: float | None) -> None:
        """Take back what `state_of` gave, e.g. after a restart (on the same clock)."""
        if failures:
            self._failures[key] = failures
        if until is not None:
            self._until[key] = until
