"""Notices between replicas (used by proxy.state.redis): one pub/sub subscription
per process wakes every task of it that waits for a checkpoint key, whichever replica published.

The subscription reconnects on its own; while it is down (and whenever it comes back) every
waiter is woken to re-check, so a lost notice costs a re-check, never a stuck waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import redis.asyncio as aioredis

from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

# How long the listener blocks for a message, and pauses before reconnecting.
RECHECK_S = 1.0


class Notices:
    def __init__(
        self,
        client: aioredis.Redis,
        channel: str,
        tasks: BackgroundTasks,
        *,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self._client = client
        self._channel = channel
        self._tasks = tasks
        self._recheck_s = recheck_s
        self._waiters: dict[bytes, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._tried = asyncio.Event()

    async def start(self) -> None:
        """Start listening; return once the first subscription is in effect on the server (or
        failed: Redis is down, and the listener goes on trying), so a notice published after
        the store opened reaches this process."""
        self._listener = self._tasks.spawn(self._listen(), name="state-redis-notices")
        await self._tried.wait()

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None

    @contextlib.contextmanager
    def waiting(self, key: bytes) -> Iterator[asyncio.Event]:
        """An event set by every notice about `key` (clear it before each re-check)."""
        woken = asyncio.Event()
        self._waiters.setdefault(key, set()).add(woken)
        try:
            yield woken
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(woken)
                if not waiters:
                    del self._waiters[key]

    async def _listen(self) -> None:
        while True:
            try:
                pubsub = self._client.pubsub()
                try:
                    await pubsub.subscribe(self._channel)
                    await self._confirmed(pubsub)
                    while True:
                        message = await pubsub.get_message(timeout=self._recheck_s)
                        if message is not None and message.get("type") == "message":
                            self._wake(self._waiters.get(bytes(message["data"]), ()))
                finally:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The guard reports outages from the calls themselves; waiters re-check anyway.
                log.debug("redis notices interrupted", extra={"error": repr(exc)})
            self._tried.set()
            for waiters in list(self._waiters.values()):
                self._wake(waiters)
            await asyncio.sleep(self._recheck_s)

    async def _confirmed(self, pubsub: aioredis.client.PubSub) -> None:
        """Read up to the server's confirmation: SUBSCRIBE is in effect from then on."""
        while True:
            message = await pubsub.get_message(timeout=self._recheck_s)
            if message is None:
                raise TimeoutError("no subscribe confirmation")
            if message.get("type") == "subscribe":
                self._tried.set()
                return

    @staticmethod
    def _wake(waiters: set[asyncio.Event] | tuple[()]) -> None:
        for woken in waiters:
            woken.set()
