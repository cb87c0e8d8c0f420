"""The archive in Redis (`state.backend: redis`): replicas share it.

Each scope (session and credential) keeps its turns in a hash, their order by time in a sorted
set, its size in a counter, and an inverted index: one sorted set per word, of the turns holding
it (scored by term frequency). A search sums the sets of its words weighted by their rarity
(ZUNIONSTORE, in Redis) and reads the best turns: it never scans the session. Every key expires
after the age bound, so an abandoned session goes away on its own.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable, Sequence

import orjson
import redis.asyncio as aioredis

from proxy.state.archive.entries import Entry, Found, Kind, Scope, find_in_two_trips
from proxy.state.archive.terms import query_terms, text_terms
from proxy.state.redis_client import RedisClient

_DROP_BATCH = 256


class RedisArchive:
    name = "redis"

    def __init__(
        self,
        redis: RedisClient,
        *,
        max_bytes: int,
        max_age_s: float,
        prefix: str = "compaction-proxy:archive:",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis_client = redis
        redis.attach()
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._ttl_s = max(1, int(max_age_s))
        self._prefix = prefix
        self._clock = clock
        self._client: aioredis.Redis | None = None

    async def open(self) -> None:
        self._client = self._redis_client.get()

    async def close(self) -> None:
        self._client = None
        await self._redis_client.close()

    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            raise RuntimeError("the archive is not open")
        return self._client

    def _key(self, session: str, tenant: str) -> str:
        digest = hashlib.sha256(f"{tenant}\x00{session}".encode()).hexdigest()[:32]
        return f"{self._prefix}{digest}"

    def _tenants_key(self, session: str) -> str:
        return f"{self._prefix}session:{session}"

    # -- writing ------------------------------------------------------------------------------

    async def add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        redis = self._redis()
        key = self._key(scope.session, scope.tenant)
        indices = [str(entry.index) for entry in entries]
        present = await redis.hmget(f"{key}:e", indices) if indices else []
        fresh = [entry for entry, had in zip(entries, present, strict=True) if had is None]
        async with redis.pipeline(transaction=False) as pipe:
            for entry in fresh:
                pipe.hset(f"{key}:e", str(entry.index), _dump(entry))
                pipe.zadd(f"{key}:o", {str(entry.index): entry.at})
                pipe.incrby(f"{key}:n", entry.size)
                pipe.sadd(f"{key}:c", entry.compaction_id)
                for term, count in text_terms(entry.text).items():
                    pipe.zadd(f"{key}:w:{term}", {str(entry.index): 1.0 + math.log(count)})
                    pipe.expire(f"{key}:w:{term}", self._ttl_s)
            pipe.sadd(self._tenants_key(scope.session), scope.tenant)
            for suffix in ("e", "o", "n", "c"):
                pipe.expire(f"{key}:{suffix}", self._ttl_s)
            pipe.expire(self._tenants_key(scope.session), self._ttl_s)
            await pipe.execute()
        return {"age": await self._drop_old(key), "size": await self._drop_beyond(key)}

    async def _drop_old(self, key: str) -> int:
        horizon = self._clock() - self._max_age_s
        old = await self._redis().zrangebyscore(f"{key}:o", "-inf", f"({horizon}")
        await self._delete(key, [_text(index) for index in old])
        return len(old)

    async def _drop_beyond(self, key: str) -> int:
        redis = self._redis()
        dropped = 0
        while int(await redis.get(f"{key}:n") or 0) > self._max_bytes:
            oldest = await redis.zrange(f"{key}:o", 0, 0)
            if not oldest:
                break
            await self._delete(key, [_text(oldest[0])])
            dropped += 1
        return dropped

    async def _delete(self, key: str, indices: list[str]) -> None:
        redis = self._redis()
        for start in range(0, len(indices), _DROP_BATCH):
            batch = indices[start : start + _DROP_BATCH]
            stored = await redis.hmget(f"{key}:e", batch)
            async with redis.pipeline(transaction=False) as pipe:
                for index, raw in zip(batch, stored, strict=True):
                    if raw is None:
                        continue
                    entry = _load(int(index), raw)
                    for term in text_terms(entry.text):
                        pipe.zrem(f"{key}:w:{term}", index)
                    pipe.hdel(f"{key}:e", index)
                    pipe.zrem(f"{key}:o", index)
                    pipe.decrby(f"{key}:n", entry.size)
                await pipe.execute()

    # -- reading ------------------------------------------------------------------------------

    async def search(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> list[Found]:
        terms = query_terms(query)
        if not terms or limit <= 0:
            return []
        found: list[Found] = []
        for each in await self._tenants(session, tenant):
            found.extend(await self._search_scope(self._key(session, each), terms, limit))
        found.sort(key=lambda item: (-item.score, -(item.index or 0)))
        return found[:limit]

    async def _tenants(self, session: str, tenant: str | None) -> list[str]:
        if tenant is not None:
            return [tenant]
        members = await self._redis().smembers(self._tenants_key(session))
        return sorted(_text(member) for member in members)

    async def _search_scope(self, key: str, terms: list[str], limit: int) -> list[Found]:
        redis = self._redis()
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zcard(f"{key}:o")
            for term in terms:
                pipe.zcard(f"{key}:w:{term}")
            total, *counts = await pipe.execute()
        weights = {
            f"{key}:w:{term}": math.log(1 + total / count)
            for term, count in zip(terms, counts, strict=True)
            if count
        }
        if not weights:
            return []
        scratch = f"{key}:q:{secrets.token_hex(8)}"
        async with redis.pipeline(transaction=True) as pipe:
            pipe.zunionstore(scratch, weights)
            pipe.zrevrange(scratch, 0, limit - 1, withscores=True)
            pipe.delete(scratch)
            _, best, _ = await pipe.execute()
        if not best:
            return []
        stored = await redis.hmget(f"{key}:e", [index for index, _ in best])
        return [
            _load(int(index), raw).found(score)
            for (index, score), raw in zip(best, stored, strict=True)
            if raw is not None
        ]

    async def find(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> tuple[list[Found], set[str] | None]:
        return await find_in_two_trips(self, session, query, tenant=tenant, limit=limit)

    async def compactions(self, session: str, *, tenant: str | None) -> set[str]:
        found: set[str] = set()
        for each in await self._tenants(session, tenant):
            members = await self._redis().smembers(f"{self._key(session, each)}:c")
            found.update(_text(member) for member in members)
        return found


def _dump(entry: Entry) -> bytes:
    return orjson.dumps(
        {
            "dialect": entry.dialect,
            "kind": entry.kind,
            "compaction_id": entry.compaction_id,
            "at": entry.at,
            "body": entry.body,
            "text": entry.text,
        }
    )


def _load(index: int, raw: bytes | str) -> Entry:
    stored = orjson.loads(raw)
    kind: Kind = "tool_output" if stored["kind"] == "tool_output" else "message"
    return Entry(
        index, stored["dialect"], kind, stored["compaction_id"], stored["at"], stored["body"],
        stored["text"],
    )  # fmt: skip


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
