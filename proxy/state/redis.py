"""State in Redis (6+, or Valkey), shared by every replica of the proxy.

- Checkpoints: a hash (`cut`, `body`) per key, kept `ttl_s`, written once (the first replica to
  write a key wins, so every replica forwards the same prefix). Keys carry the checkpoint
  format's version, so one written by another version never blocks this one's. `longest(digests)` is one script
  call walking the digests from the newest down, so a reused request walks only what is newer
  than its checkpoint; checkpoints read are kept decoded in a bounded cache (they never change).
- Single-flight: a lease per checkpoint key (`SET NX PX` holding a fencing id from `INCR`),
  renewed, released or renewed only by the holder of that id; a replica that dies lets it
  expire. Releases and writes are published on one channel that wakes waiting replicas (one
  subscription per process; a re-check at most once a second in case a notice is lost).
- Cooldowns per model and tenant, compactions already forwarded, memory items per session (a set),
  the bound models (one sorted set by when each was learned, the newest MAX_BOUND_MODELS kept).
Scripts touch keys derived from their arguments: a single Redis, not Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import orjson
import redis.asyncio as aioredis
from cachetools import LRUCache
from redis.commands.core import AsyncScript

from compaction import CHECKPOINT_VERSION, Checkpoint
from proxy.state import redis_scripts as scripts
from proxy.state.cooldown import FORGET_FAILURES_AFTER_S
from proxy.state.redis_client import RedisClient
from proxy.state.redis_notices import RECHECK_S, Notices
from proxy.state.roles import CACHED_CHECKPOINTS, MAX_BOUND_MODELS, Lease
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

PREFIX = "compaction-proxy:"


class RedisLease:
    """Renewed at a third of its TTL by a background task (BackgroundTasks) until released."""

    def __init__(
        self, store: RedisStore, key: bytes, fence: int, ttl_s: float, tasks: BackgroundTasks
    ) -> None:
        self._store = store
        self._key = key
        self.fence = fence
        self._ttl_ms = int(ttl_s * 1000)
        self._keeper = tasks.spawn(self._keep(ttl_s / 3), name="state-redis-lease")

    async def renew(self) -> bool:
        lock = self._store.lock_key(self._key)
        return bool(await self._store.script(scripts.RENEW, [lock], [self.fence, self._ttl_ms]))

    async def release(self) -> None:
        self._keeper.cancel()
        lock = self._store.lock_key(self._key)
        await self._store.script(
            scripts.RELEASE, [lock], [self.fence, self._store.channel, self._key]
        )

    async def _keep(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                if not await self.renew():
                    log.warning("a single-flight lease was lost before its work finished")
                    return
            except Exception as exc:  # Redis is down: the work goes on regardless
                log.debug("lease renewal failed", extra={"error": repr(exc)})


class RedisStore:
    name = "redis"

    def __init__(
        self,
        redis: RedisClient,
        *,
        ttl_s: float,
        cached: int = CACHED_CHECKPOINTS,
        failure_threshold: int,
        failure_cooldown_s: float,
        lease_ttl_s: float,
        tasks: BackgroundTasks,
        prefix: str = PREFIX,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self._redis = redis
        redis.attach()
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._threshold = failure_threshold
        self._cooldown_ms = int(failure_cooldown_s * 1000)
        self._lease_ttl_s = lease_ttl_s
        self._prefix = prefix.encode()
        self.channel = f"{prefix}done"
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._cache: LRUCache[bytes, Checkpoint] = LRUCache(cached)
        self._notices: Notices | None = None
        self._tasks = tasks
        self._recheck_s = recheck_s

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, and say what keeps this process from using Redis (raising
        proxy.state.redis_client.Unreachable: the guard logs it once and serves in-process);
        the client stays, to be retried later."""
        self._client = self._redis.get()
        self._notices = Notices(self._client, self.channel, self._tasks, recheck_s=self._recheck_s)
        await self._notices.start()
        await self._redis.check()

    async def close(self) -> None:
        if self._notices is not None:
            await self._notices.close()
            self._notices = None
        self._client = None
        await self._redis.close()

    # -- checkpoints -------------------------------------------------------------------------

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        if not digests:
            return None
        packed = b"".join(digests)
        prefix = self._checkpoint_key(b"")
        cut = await self.script(scripts.LONGEST, [], [prefix, packed]) or 0
        while cut > 0:
            key = digests[cut - 1]
            found = self._cache.get(key)
            if found is None:
                found = await self._read(key, cut)
            if found is not None:
                return found
            # Expired or unreadable since the script ran: look below it.
            cut = await self.script(scripts.LONGEST, [], [prefix, packed[: (cut - 1) * 16]]) or 0
        return None

    async def _read(self, key: bytes, cut: int) -> Checkpoint | None:
        body = await self._require().hget(self._checkpoint_key(key), "body")
        if body is None:
            return None
        try:
            found = Checkpoint.from_json(orjson.loads(body))
        except (ValueError, orjson.JSONDecodeError):
            return None  # written by another version, or damaged: a miss, never a crash
        if found.cut != cut or found.key != key:
            return None
        self._cache[key] = found
        return found

    async def put(self, checkpoint: Checkpoint) -> None:
        body = orjson.dumps(checkpoint.to_json())
        await self.script(
            scripts.PUT,
            [self._checkpoint_key(checkpoint.key)],
            [checkpoint.cut, body, self._ttl_ms, self.channel, checkpoint.key],
        )

    # -- cooldowns ---------------------------------------------------------------------------

    async def is_cooling(self, key: str) -> bool:
        return bool(await self._require().exists(self._cooldown_key(key, "until")))

    async def record_outcome(self, key: str, *, ok: bool) -> None:
        client = self._require()
        failures_key = self._cooldown_key(key, "failures")
        if ok:
            await client.delete(failures_key, self._cooldown_key(key, "until"))
            return
        async with client.pipeline(transaction=True) as pipe:
            pipe.incr(failures_key)
            pipe.expire(failures_key, int(FORGET_FAILURES_AFTER_S))
            failures, _ = await pipe.execute()
        if int(failures) >= self._threshold and self._cooldown_ms > 0:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(self._cooldown_key(key, "until"), 1, px=self._cooldown_ms)
                pipe.delete(failures_key)
                await pipe.execute()

    async def mark_forwarded(self, compaction_id: str) -> bool:
        key = self._forwarded_key(compaction_id)
        return bool(await self._require().set(key, 1, px=self._ttl_ms, nx=True))

    # -- bound models --------------------------------------------------------------------------

    async def bound_models(self) -> Sequence[str]:
        found = await self._require().zrange(self._bound_key(), 0, -1)
        return [model.decode() if isinstance(model, bytes) else str(model) for model in found]

    async def add_bound_model(self, model: str) -> None:
        key = self._bound_key()
        async with self._require().pipeline(transaction=True) as pipe:
            pipe.zadd(key, {model: time.time()})
            pipe.zremrangebyrank(key, 0, -MAX_BOUND_MODELS - 1)
            await pipe.execute()

    # -- memory items --------------------------------------------------------------------------

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        name = self._memory_key(session_id)
        async with self._require().pipeline(transaction=True) as pipe:
            for key in keys:
                pipe.sadd(name, key)
            pipe.pexpire(name, self._ttl_ms)
            added = await pipe.execute()
        return {key for key, new in zip(keys, added, strict=False) if new}

    async def release(self, session_id: str, keys: Sequence[str]) -> None:
        if keys:
            await self._require().srem(self._memory_key(session_id), *keys)

    # -- single-flight -----------------------------------------------------------------------

    async def acquire(self, key: bytes) -> Lease | None:
        fence = await self.script(
            scripts.ACQUIRE,
            [self.lock_key(key), self._prefix + b"fence"],
            [int(self._lease_ttl_s * 1000)],
        )
        if fence is None:
            return None
        return RedisLease(self, key, fence, self._lease_ttl_s, self._tasks)

    async def holder(self, digests: Sequence[bytes]) -> bytes | None:
        if not digests:
            return None
        locks = self._prefix + b"lock:"
        cut = await self.script(scripts.HOLDER, [], [locks, b"".join(digests)]) or 0
        return digests[cut - 1] if cut > 0 else None

    async def wait(self, key: bytes, timeout_s: float) -> None:
        client = self._require()
        deadline = time.monotonic() + timeout_s
        with self._require_notices().waiting(key) as woken:
            while True:
                # Registered before checking, so a notice between the check and the wait counts.
                # Only the lease decides: a stored checkpoint this process cannot use would
                # otherwise send its caller straight back to a lease still held (a busy loop).
                woken.clear()
                lock_ms = await client.pttl(self.lock_key(key))
                remaining = deadline - time.monotonic()
                if lock_ms < 0 or remaining <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        woken.wait(), min(remaining, self._recheck_s, lock_ms / 1000 + 0.01)
                    )

    # -- keys and calls ------------------------------------------------------------------------

    async def script(
        self, source: str, keys: Sequence[bytes], args: Sequence[bytes | str | int]
    ) -> int | None:
        """Run one of redis_scripts: each answers an integer, or nil."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._require().register_script(source)
        reply = await script(keys=keys, args=args)
        return None if reply is None else int(reply)

    def lock_key(self, key: bytes) -> bytes:
        return self._prefix + b"lock:" + key

    def _checkpoint_key(self, key: bytes) -> bytes:
        return self._prefix + b"cp:v%d:" % CHECKPOINT_VERSION + key

    def _forwarded_key(self, compaction_id: str) -> str:
        return f"{self._prefix.decode()}forwarded:{compaction_id}"

    def _bound_key(self) -> str:
        return f"{self._prefix.decode()}bound-models"

    def _memory_key(self, session_id: str) -> str:
        return f"{self._prefix.decode()}memory:{session_id}"

    def _cooldown_key(self, key: str, part: str) -> str:
        return f"{self._prefix.decode()}cooldown:{part}:{key}"

    def _require_notices(self) -> Notices:
        if self._notices is None:
            raise ConnectionError("the redis store is not open")
        return self._notices

    def _require(self) -> aioredis.Redis:
        if self._client is None:
            raise ConnectionError("the redis store is not open")
        return self._client
