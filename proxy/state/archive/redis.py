"""The archive in Redis (`state.backend: redis`): replicas share it.

The keys of a scope (session and credential), `{prefix}{digest}`:
- `:e` hash, turn index -> the turn stored once: its fields, then its JSON and text compressed
  together (proxy.state.archive.entries.pack);
- `:g` hash, turn index -> its signature, the word index (proxy.state.archive.terms: a Bloom
  filter of its distinct words, 8 bits a word, at most 512 bytes);
- `:o` sorted set, the turn indexes by when they were archived;
- `:c` set, the compactions whose turns it holds.
The keys of every scope: `{prefix}scopes` (sorted set: each scope by when it last archived),
`{prefix}weights` (hash: what each scope weighs), `{prefix}total` (what all weigh together) and
`{prefix}session:{session}` (the credentials a session archived under).

A search reads the signatures of the scope's newest SEARCHED turns (one script), keeps the
CANDIDATES whose filters hold the most query words, newest first at equal count, reads them
and scores their text with the simple term score: a word index of a byte a word per turn, where
one sorted set per distinct word took ~10,500 keys and 2.65 MB per session of 4 compactions for
0.19 MB of text, and building its per-word pipelines held the event loop (blobs and signatures
are built in a thread). Archives written by an earlier version (a sorted set per word, no
signatures) are not searched: they expire after `max_age_s` like every archive key.

Bounds, as turns are added: a scope's turns older than `max_age_s` and its oldest beyond
`max_bytes`; scopes not archived for `max_age_s`; then, while all together weigh more than
`max_total_bytes`, the least recently archived scope goes whole, every key of it in one script
(no orphan: a partial archive would keep memory while recall finds nothing). A turn weighs its
blob, its signature and what Redis spends on its three entries (`weight`). Where Redis has a
`maxmemory`, the total is at most half of it: the archive trims itself long before Redis would
evict anything, checkpoints included. Every key of a scope also expires after `max_age_s`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Sequence

import orjson
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from proxy.state.archive.entries import Entry, Found, Kind, Scope, find_in_two_trips, unpack
from proxy.state.archive.terms import held, query_terms, score_text, signature
from proxy.state.redis_client import RedisClient

log = logging.getLogger(__name__)

SEARCHED = 4096
"""A search reads the signatures of at most this many of a scope's newest turns."""
CANDIDATES = 64
"""...and the texts of at most this many (or `limit`, when more)."""
# What Redis spends on a turn beside its blob and signature: two hash fields and a sorted-set
# entry (their dict entries, skiplist node, string headers), measured with INFO used_memory
# (tests/proxy/state/archive/test_redis_bound.py).
_ENTRY_BYTES = 300
_DROP_BATCH = 256
_SUFFIXES = ("e", "g", "o", "c")

# KEYS: none (they are named from ARGV, like the checkpoint scripts). ARGV: prefix, scope
# member, scope digest, session, tenant. Drops one scope whole; how many turns it held, or -1
# when another process dropped it first.
_DROP_SCOPE = """
local prefix, member, scope = ARGV[1], ARGV[2], ARGV[1] .. ARGV[3]
if redis.call('ZREM', prefix .. 'scopes', member) == 0 then return -1 end
local weight = tonumber(redis.call('HGET', prefix .. 'weights', member) or '0')
redis.call('HDEL', prefix .. 'weights', member)
redis.call('DECRBY', prefix .. 'total', weight)
local turns = redis.call('ZCARD', scope .. ':o')
redis.call('DEL', scope .. ':e', scope .. ':g', scope .. ':o', scope .. ':c')
redis.call('SREM', prefix .. 'session:' .. ARGV[4], ARGV[5])
return turns
"""
# KEYS: entries, signatures, order, weights, total. ARGV: the scope's member, what Redis spends
# on a turn's entries, then the turns' indexes. Only a turn this call really removes is taken
# off the weights (two processes dropping the same oldest turn take it off once).
_DELETE_TURNS = """
local weight = 0
for i = 3, #ARGV do
  local blob = redis.call('HSTRLEN', KEYS[1], ARGV[i])
  if redis.call('HDEL', KEYS[1], ARGV[i]) == 1 then
    weight = weight + blob + redis.call('HSTRLEN', KEYS[2], ARGV[i]) + tonumber(ARGV[2])
  end
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('ZREM', KEYS[3], ARGV[i])
end
if weight > 0 then
  redis.call('HINCRBY', KEYS[4], ARGV[1], -weight)
  redis.call('DECRBY', KEYS[5], weight)
end
return weight
"""
# KEYS: order, signatures. ARGV: how many. The newest turns' indexes and signatures.
_SIGNATURES = """
local indexes = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #indexes == 0 then return {{}, {}} end
return {indexes, redis.call('HMGET', KEYS[2], unpack(indexes))}
"""


class RedisArchive:
    name = "redis"

    def __init__(
        self,
        redis: RedisClient,
        *,
        max_bytes: int,
        max_age_s: float,
        max_total_bytes: int | None = None,
        prefix: str = "compaction-proxy:archive:",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis_client = redis
        redis.attach()
        self._max_bytes = max_bytes
        self._max_total_bytes = max_total_bytes
        self._max_age_s = max_age_s
        self._ttl_s = max(1, int(max_age_s))
        self._prefix = prefix
        self._clock = clock
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}

    def weight(self, entry: Entry) -> int:
        blob, mark = _stored(entry)
        return _weight(len(blob), len(mark))

    async def open(self) -> None:
        self._client = self._redis_client.get()
        await self._bound_by_maxmemory()

    async def close(self) -> None:
        self._client = None
        await self._redis_client.close()

    async def _bound_by_maxmemory(self) -> None:
        """At most half of Redis's `maxmemory`, where it has one (read once, at open)."""
        try:
            maxmemory = int((await self._redis().info("memory")).get("maxmemory", 0))
        except Exception:  # a Redis down at start: the configured bound alone
            return
        if maxmemory and (self._max_total_bytes is None or self._max_total_bytes > maxmemory // 2):
            self._max_total_bytes = maxmemory // 2
            log.info(
                "archive bounded to half of Redis maxmemory",
                extra={"max_total_bytes": self._max_total_bytes},
            )

    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            raise RuntimeError("the archive is not open")
        return self._client

    async def _script(self, source: str, keys: Sequence[str], args: Sequence[str | int]) -> object:
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._redis().register_script(source)
        return await script(keys=keys, args=args)

    def _digest(self, session: str, tenant: str) -> str:
        return hashlib.sha256(f"{tenant}\x00{session}".encode()).hexdigest()[:32]

    def _key(self, session: str, tenant: str) -> str:
        return f"{self._prefix}{self._digest(session, tenant)}"

    def _tenants_key(self, session: str) -> str:
        return f"{self._prefix}session:{session}"

    # -- writing ------------------------------------------------------------------------------

    async def add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        redis = self._redis()
        key = self._key(scope.session, scope.tenant)
        member = _member(scope.session, scope.tenant)
        indices = [str(entry.index) for entry in entries]
        present = await redis.hmget(f"{key}:g", indices) if indices else []
        candidates = [entry for entry, had in zip(entries, present, strict=True) if had is None]
        stored = await asyncio.to_thread(lambda: [_stored(entry) for entry in candidates])
        # A turn is claimed by writing its blob only where none is (HSETNX): of two processes
        # archiving the same turn at once, one writes it and counts its weight.
        async with redis.pipeline(transaction=False) as pipe:
            for entry, (blob, _) in zip(candidates, stored, strict=True):
                pipe.hsetnx(f"{key}:e", str(entry.index), blob)
            claimed = await pipe.execute() if candidates else []
        turns = [
            (entry, blob, mark)
            for entry, (blob, mark), won in zip(candidates, stored, claimed, strict=True)
            if won
        ]
        fresh = [entry for entry, _, _ in turns]
        added = sum(_weight(len(blob), len(mark)) for _, blob, mark in turns)
        async with redis.pipeline(transaction=False) as pipe:
            if fresh:
                pipe.hset(f"{key}:g", mapping={str(e.index): mark for e, _, mark in turns})
                pipe.zadd(f"{key}:o", {str(entry.index): entry.at for entry in fresh})
                pipe.sadd(f"{key}:c", *{entry.compaction_id for entry in fresh})
                pipe.hincrby(f"{self._prefix}weights", member, added)
                pipe.incrby(f"{self._prefix}total", added)
                pipe.zadd(f"{self._prefix}scopes", {member: self._clock()})
                pipe.sadd(self._tenants_key(scope.session), scope.tenant)
            for suffix in _SUFFIXES:
                pipe.expire(f"{key}:{suffix}", self._ttl_s)
            pipe.expire(self._tenants_key(scope.session), self._ttl_s)
            await pipe.execute()
        return {
            "age": await self._drop_old(key, member) + await self._drop_idle(),
            "size": await self._drop_beyond(key, member, self._max_bytes),
            "total": await self._drop_over_total(scope),
        }

    async def _drop_old(self, key: str, member: str) -> int:
        horizon = self._clock() - self._max_age_s
        old = await self._redis().zrangebyscore(f"{key}:o", "-inf", f"({horizon}")
        await self._delete(key, member, [_text(index) for index in old])
        return len(old)

    async def _drop_idle(self) -> int:
        """Scopes not archived since the age bound, whole (a batch at a time)."""
        horizon = self._clock() - self._max_age_s
        idle = await self._redis().zrangebyscore(
            f"{self._prefix}scopes", "-inf", f"({horizon}", start=0, num=_DROP_BATCH
        )
        dropped = 0
        for member in idle:
            dropped += max(0, await self._drop_scope(_text(member)))
        return dropped

    async def _drop_beyond(self, key: str, member: str, bound: int) -> int:
        """The scope's oldest turns until it weighs at most `bound`."""
        redis = self._redis()
        dropped = 0
        while int(await redis.hget(f"{self._prefix}weights", member) or 0) > bound:
            oldest = await redis.zrange(f"{key}:o", 0, 0)
            if not oldest:
                break
            await self._delete(key, member, [_text(oldest[0])])
            dropped += 1
        return dropped

    async def _drop_over_total(self, scope: Scope) -> int:
        """While every scope together weighs more than the total bound: the least recently
        archived scope whole (the one just written, when it is the only one: its oldest)."""
        if self._max_total_bytes is None:
            return 0
        redis = self._redis()
        current = _member(scope.session, scope.tenant)
        dropped = 0
        while (total := int(await redis.get(f"{self._prefix}total") or 0)) > self._max_total_bytes:
            oldest = [_text(each) for each in await redis.zrange(f"{self._prefix}scopes", 0, 1)]
            others = [each for each in oldest if each != current]
            if others:
                dropped += max(0, await self._drop_scope(others[0]))
                continue
            weight = int(await redis.hget(f"{self._prefix}weights", current) or 0)
            excess = total - self._max_total_bytes
            key = self._key(scope.session, scope.tenant)
            return dropped + await self._drop_beyond(key, current, max(0, weight - excess))
        return dropped

    async def _drop_scope(self, member: str) -> int:
        """One scope whole: how many turns it held (-1: another process dropped it first)."""
        tenant, _, session = member.partition("\x00")
        digest = self._digest(session, tenant)
        turns = await self._script(_DROP_SCOPE, [], [self._prefix, member, digest, session, tenant])
        assert isinstance(turns, int)  # the script answers an integer
        return turns

    async def _delete(self, key: str, member: str, indices: list[str]) -> None:
        keys = [
            f"{key}:e",
            f"{key}:g",
            f"{key}:o",
            f"{self._prefix}weights",
            f"{self._prefix}total",
        ]
        for start in range(0, len(indices), _DROP_BATCH):
            batch = indices[start : start + _DROP_BATCH]
            await self._script(_DELETE_TURNS, keys, [member, _weight(0, 0), *batch])

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
        reply = await self._script(_SIGNATURES, [f"{key}:o", f"{key}:g"], [SEARCHED])
        assert isinstance(reply, list)  # the script answers two lists
        indexes: list[bytes] = reply[0]
        marks: list[bytes | None] = reply[1]
        if not indexes:
            return []
        best = await asyncio.to_thread(_candidates, indexes, marks, terms, max(limit, CANDIDATES))
        if not best:
            return []
        stored = [
            raw if isinstance(raw, bytes) else None
            for raw in await self._redis().hmget(f"{key}:e", best)
        ]
        return await asyncio.to_thread(_scored, best, stored, terms)

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


def _member(session: str, tenant: str) -> str:
    """A scope in the keys of every scope (a tenant is a hex digest: never a NUL)."""
    return f"{tenant}\x00{session}"


def _weight(blob: int, mark: int) -> int:
    return blob + mark + _ENTRY_BYTES


def _stored(entry: Entry) -> tuple[bytes, bytes]:
    """A turn as stored: its blob (its fields as JSON, a NUL, its packed JSON and text) and its
    signature."""
    fields = orjson.dumps([entry.dialect, entry.kind, entry.compaction_id, entry.at])
    return fields + b"\x00" + entry.packed, signature(entry.text)


def _candidates(
    indexes: list[bytes], marks: list[bytes | None], terms: list[str], count: int
) -> list[bytes]:
    """The turns whose signatures hold the most terms (newest first at equal count: `indexes`
    come newest first), at most `count`."""
    ranked: list[tuple[int, int, bytes]] = []
    for order, (index, mark) in enumerate(zip(indexes, marks, strict=True)):
        if mark is None:
            continue
        hits = held(mark, terms)
        if hits:
            ranked.append((-hits, order, index))
    ranked.sort()
    return [index for _, _, index in ranked[:count]]


def _scored(indexes: list[bytes], stored: list[bytes | None], terms: list[str]) -> list[Found]:
    """The texts of the turns `indexes` scored against `terms`, best first (false hits of the
    signatures, scored 0, left out)."""
    found = []
    for index, raw in zip(indexes, stored, strict=True):
        if raw is None:
            continue
        fields, _, packed = raw.partition(b"\x00")
        body, text = unpack(packed)
        score = score_text(text, terms)
        if score > 0:
            _, stored_kind, compaction_id, at = orjson.loads(fields)
            kind: Kind = "tool_output" if stored_kind == "tool_output" else "message"
            found.append(Found(kind, int(index), score, text, body, compaction_id, at))
    found.sort(key=lambda item: (-item.score, -(item.index or 0)))
    return found


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
