"""The session records /admin shows, in Redis (`state.backend: redis`): every replica writes its
requests and compactions here, so `/admin/sessions/{id}` and the dashboard on any replica show
the whole fleet (proxy.admin.records reads them; the roles are in proxy.state.roles).

Keys, under `compaction-proxy:records:`:
- `seen`: a sorted set of session ids by last activity (the list's order, and what goes first);
- `session:{id}`: a hash of the session's totals and the bytes its documents hold;
- `records:{id}`, `timeline:{id}`: its compaction records and timeline lines, lists of JSON
  documents trimmed to the newest `admin.records_per_session` as each is appended;
- `bytes`: what every session holds, summed.
One script per change keeps them together whichever replica writes (a single Redis, not Cluster:
it touches keys derived from its arguments). Past `admin.max_sessions` sessions or
`admin.max_records_mb` of documents (a fixed 1 KiB per session included), the least recently
seen sessions are deleted whole; the keys carry no TTL, so an LRU Redis never takes them
piecemeal.

A request never waits on Redis: `add` queues the change and one background task sends the queue
in pipelined batches. What cannot be sent (Redis down, the queue past `MAX_PENDING`) is dropped
and counted in `compaction_proxy_state_errors_total{operation="records"}`: the process's own
records still hold it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

import orjson
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from proxy.metrics import StateMetrics
from proxy.state.redis import PREFIX
from proxy.state.redis_client import RedisClient
from proxy.state.roles import SessionChange, SessionTotals, SharedSession
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Changes queued for Redis at most; past it the oldest are dropped (and counted)."""
SESSION_BYTES = 1024
"""What a session's totals count for against `admin.max_records_mb`, beside its documents."""
_BATCH = 256

# ARGV: prefix, session, now, per session, max sessions, max bytes, bytes per session, the
# counts added (7, as `counts` below), the fields set ('' leaves one as it was, 3), a record and
# a timeline line ('' for none).
_ADD = """
local p, sid, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local per, max_sessions, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local seen, total, totals = p .. 'seen', p .. 'bytes', p .. 'session:' .. sid
if redis.call('EXISTS', totals) == 0 then
  redis.call('HSET', totals, 'first_seen', ARGV[3], 'last_seen', ARGV[3], 'bytes', ARGV[7])
  redis.call('INCRBY', total, ARGV[7])
end
-- Replicas' clocks differ: a session's last activity never goes back.
local last = tonumber(redis.call('HGET', totals, 'last_seen'))
if now > last then redis.call('HSET', totals, 'last_seen', ARGV[3]) else now = last end
redis.call('ZADD', seen, now, sid)
local counts = {'requests', 'records_total', 'summarizer_calls', 'summarizer_failures',
                'pinned_overflow', 'tokens_sent', 'tokens_forwarded'}
for i, field in ipairs(counts) do
  local n = tonumber(ARGV[7 + i])
  if n ~= 0 then redis.call('HINCRBY', totals, field, n) end
end
for i, field in ipairs({'dialect', 'model', 'window'}) do
  if ARGV[14 + i] ~= '' then redis.call('HSET', totals, field, ARGV[14 + i]) end
end
local function append(list, item)
  if item == '' then return end
  local grown = #item
  redis.call('RPUSH', list, item)
  while redis.call('LLEN', list) > per do grown = grown - #redis.call('LPOP', list) end
  redis.call('HINCRBY', totals, 'bytes', grown)
  redis.call('INCRBY', total, grown)
end
append(p .. 'records:' .. sid, ARGV[18])
append(p .. 'timeline:' .. sid, ARGV[19])
-- The bounds: the least recently seen sessions go whole, never the one just written.
while redis.call('ZCARD', seen) > 1 and (redis.call('ZCARD', seen) > max_sessions
    or tonumber(redis.call('GET', total) or '0') > max_bytes) do
  local oldest = redis.call('ZRANGE', seen, 0, 1)
  local gone = oldest[1]
  if gone == sid then gone = oldest[2] end
  local size = tonumber(redis.call('HGET', p .. 'session:' .. gone, 'bytes') or '0')
  redis.call('DEL', p .. 'session:' .. gone, p .. 'records:' .. gone, p .. 'timeline:' .. gone)
  redis.call('ZREM', seen, gone)
  redis.call('DECRBY', total, size)
end
return 1
"""


class RedisRecords:
    """SharedRecords in Redis: bounded to `per_session` records and timeline lines per session,
    `max_sessions` sessions and `max_bytes` of documents in total."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        per_session: int,
        max_sessions: int,
        max_bytes: int,
        metrics: StateMetrics,
        tasks: BackgroundTasks,
        prefix: str = PREFIX + "records:",
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._redis = redis
        redis.attach()
        self._bounds = (per_session, max_sessions, max_bytes, SESSION_BYTES)
        self._errors = metrics.errors.labels(backend="redis", operation="records")
        self._tasks = tasks
        self._prefix = prefix
        self._pending: deque[tuple[str, SessionChange, float]] = deque()
        self._max_pending = max_pending
        self._sender: asyncio.Task[None] | None = None
        self._client: aioredis.Redis | None = None
        self._script: AsyncScript | None = None
        self._failing = False  # said once per outage

    async def open(self) -> None:
        self._client = self._redis.get()
        self._script = self._client.register_script(_ADD)

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
            self._sender = None  # cancelled before it ran, it could not say so itself
        if self._client is not None and self._pending:
            await self._send_queued()  # what the last requests added: one try, bounded by timeout
        self._client = None
        await self._redis.close()

    # -- writes ----------------------------------------------------------------------------

    def add(self, session_id: str, change: SessionChange, now: float) -> None:
        if len(self._pending) >= self._max_pending:
            self._pending.popleft()
            self._errors.inc()
        self._pending.append((session_id, change, now))
        if self._sender is None and self._client is not None and not self._tasks.closed:
            self._sender = self._tasks.spawn(self._send(), name="state-redis-records")

    async def _send(self) -> None:
        try:
            await self._send_queued()
        finally:
            self._sender = None

    async def _send_queued(self) -> None:
        while self._pending:
            count = min(len(self._pending), _BATCH)
            batch = [self._pending.popleft() for _ in range(count)]
            try:
                await self._write(batch)
            except Exception as exc:  # Redis down or slow: dropped, counted, said once
                self._errors.inc(len(batch))
                if not self._failing:
                    self._failing = True
                    log.warning("session records not written to redis", extra={"error": repr(exc)})
            else:
                self._failing = False

    async def _write(self, batch: Sequence[tuple[str, SessionChange, float]]) -> None:
        client, script = self._require(), self._script
        assert script is not None  # set with the client
        async with client.pipeline(transaction=False) as pipe:
            for session_id, change, now in batch:
                await script(keys=[], args=self._arguments(session_id, change, now), client=pipe)
            await pipe.execute()

    def _arguments(
        self, session_id: str, change: SessionChange, now: float
    ) -> list[str | int | bytes]:
        counts = (
            change.requests, change.records, change.summarizer_calls,
            change.summarizer_failures, change.pinned_overflow, change.tokens_sent,
            change.tokens_forwarded,
        )  # fmt: skip
        fields = (change.dialect, change.model, change.window)
        return [
            self._prefix,
            session_id,
            repr(now),
            *self._bounds,
            *counts,
            *("" if value is None else str(value) for value in fields),
            _json(change.record),
            _json(change.timeline),
        ]

    # -- reads -----------------------------------------------------------------------------

    async def newest(self, offset: int, limit: int) -> tuple[list[tuple[str, SessionTotals]], int]:
        client = self._require()
        seen = self._prefix + "seen"
        if limit <= 0:
            return [], int(await client.zcard(seen))
        async with client.pipeline(transaction=False) as pipe:
            pipe.zcard(seen)
            pipe.zrevrange(seen, offset, offset + limit - 1)
            total, ids = await pipe.execute()
        return await self._totals([sid.decode() for sid in ids]), int(total)

    async def every(self) -> list[tuple[str, SessionTotals]]:
        ids: list[bytes] = await self._require().zrevrange(self._prefix + "seen", 0, -1)  # type: ignore[assignment]
        return await self._totals([sid.decode() for sid in ids])

    async def session(self, session_id: str) -> SharedSession | None:
        p = self._prefix
        async with self._require().pipeline(transaction=False) as pipe:
            pipe.hgetall(f"{p}session:{session_id}")
            pipe.lrange(f"{p}records:{session_id}", 0, -1)
            pipe.lrange(f"{p}timeline:{session_id}", 0, -1)
            totals, records, timeline = await pipe.execute()
        if not totals:
            return None
        return SharedSession(
            totals=_totals_of(totals, len(records)),
            records=[orjson.loads(record) for record in records],
            timeline=[orjson.loads(line) for line in timeline],
        )

    async def _totals(self, ids: Sequence[str]) -> list[tuple[str, SessionTotals]]:
        """The totals of `ids`, in their order; a session deleted meanwhile is left out."""
        if not ids:
            return []
        p = self._prefix
        async with self._require().pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.hgetall(f"{p}session:{sid}")
                pipe.llen(f"{p}records:{sid}")
            replies = await pipe.execute()
        return [
            (sid, _totals_of(totals, kept))
            for sid, totals, kept in zip(ids, replies[::2], replies[1::2], strict=True)
            if totals
        ]

    def _require(self) -> aioredis.Redis:
        if self._client is None:
            raise ConnectionError("the shared records are not open")
        return self._client


def _json(document: object) -> bytes:
    return b"" if document is None else orjson.dumps(document, default=repr)


def _totals_of(fields: dict[bytes, bytes], records_kept: int) -> SessionTotals:
    def count(name: str) -> int:
        return int(fields.get(name.encode(), b"0"))

    def text(name: str) -> str | None:
        value = fields.get(name.encode())
        return None if value is None else value.decode()

    window = text("window")
    return SessionTotals(
        first_seen=float(fields[b"first_seen"]),
        last_seen=float(fields[b"last_seen"]),
        requests=count("requests"),
        records_total=count("records_total"),
        records_kept=records_kept,
        dialect=text("dialect"),
        model=text("model"),
        window=int(window) if window is not None else None,
        tokens_sent=count("tokens_sent"),
        tokens_forwarded=count("tokens_forwarded"),
        summarizer_calls=count("summarizer_calls"),
        summarizer_failures=count("summarizer_failures"),
        pinned_overflow=count("pinned_overflow"),
    )
