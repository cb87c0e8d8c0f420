"""The session records /admin shows, in Redis (`state.backend: redis`): every replica writes its
requests and compactions here, so `/admin/sessions/{id}` and the dashboard on any replica show
the whole fleet (proxy.admin.records reads them; the roles are in proxy.state.roles).

Keys, under `compaction-proxy:records:`:
- `seen`: a sorted set of session ids by last activity (the list's order, and what goes first);
- `totals`: a hash of each session's totals, a JSON document (what a page of sessions shows,
  read for thousands of sessions in one reply), with the bytes its documents hold;
- `records:{id}`, `timeline:{id}`: its compaction records and timeline lines, lists of JSON
  documents trimmed to the newest `admin.records_per_session` as they are appended;
- `bytes`: what every session holds, summed.
One script per change keeps them together whichever replica writes (a single Redis, not Cluster:
it touches keys derived from its arguments). Past `admin.max_sessions` sessions or
`admin.max_records_mb` of documents (a fixed 1 KiB per session included), the least recently
seen sessions are deleted whole; the keys carry no TTL, so an LRU Redis never takes them
piecemeal.

A request never waits on Redis: `add` queues the change, merged with what its session already
has queued, and one background task sends the queue in pipelined batches, one script call per
session. What cannot be sent (Redis down, more than `MAX_PENDING` sessions queued) is dropped and
counted in `compaction_proxy_state_errors_total{operation="records"}`: the process's own records
still hold it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from proxy.metrics import StateMetrics
from proxy.state.redis import PREFIX
from proxy.state.redis_client import RedisClient
from proxy.state.roles import Document, SessionChange, SessionTotals, SharedSession
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

MAX_PENDING = 1000
"""Sessions with changes queued for Redis at most; past it the oldest queued are dropped (and
counted)."""
SESSION_BYTES = 1024
"""What a session's totals count for against `admin.max_records_mb`, beside its documents."""
_BATCH = 256

# ARGV: prefix, session, now, per session, max sessions, max bytes, bytes per session, the
# counts added (7, as `counts` below), the fields set ('' leaves one as it was, 3), how many
# records follow, the records, the timeline lines.
_ADD = """
local p, sid, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local per, max_sessions, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local seen, totals, total = p .. 'seen', p .. 'totals', p .. 'bytes'
local raw = redis.call('HGET', totals, sid)
local t
if raw then
  t = cjson.decode(raw)
else
  t = {session_id = sid, first_seen = now, last_seen = now, requests = 0, records_total = 0,
       records_kept = 0, tokens_sent = 0, tokens_forwarded = 0, summarizer_calls = 0,
       summarizer_failures = 0, pinned_overflow = 0, bytes = tonumber(ARGV[7])}
  redis.call('INCRBY', total, t.bytes)
end
-- Replicas' clocks differ: a session's last activity never goes back.
if now > t.last_seen then t.last_seen = now end
local counts = {'requests', 'records_total', 'summarizer_calls', 'summarizer_failures',
                'pinned_overflow', 'tokens_sent', 'tokens_forwarded'}
for i, name in ipairs(counts) do t[name] = t[name] + tonumber(ARGV[7 + i]) end
local fields = {'dialect', 'model', 'window'}
for i, name in ipairs(fields) do
  local value = ARGV[14 + i]
  if value ~= '' then t[name] = (name == 'window') and tonumber(value) or value end
end
local function append(list, first, last)
  if last < first then return 0, nil end
  local grown = 0
  for i = first, last do
    redis.call('RPUSH', list, ARGV[i])
    grown = grown + #ARGV[i]
  end
  local length = redis.call('LLEN', list)
  while length > per do
    grown = grown - #redis.call('LPOP', list)
    length = length - 1
  end
  return grown, length
end
local records = tonumber(ARGV[18])
local grown, kept = append(p .. 'records:' .. sid, 19, 18 + records)
if kept then t.records_kept = kept end
grown = grown + append(p .. 'timeline:' .. sid, 19 + records, #ARGV)
t.bytes = t.bytes + grown
redis.call('INCRBY', total, grown)
redis.call('HSET', totals, sid, cjson.encode(t))
redis.call('ZADD', seen, t.last_seen, sid)
-- The bounds: the least recently seen sessions go whole, never the one just written.
while redis.call('ZCARD', seen) > 1 and (redis.call('ZCARD', seen) > max_sessions
    or tonumber(redis.call('GET', total) or '0') > max_bytes) do
  local oldest = redis.call('ZRANGE', seen, 0, 1)
  local gone = oldest[1]
  if gone == sid then gone = oldest[2] end
  local held = redis.call('HGET', totals, gone)
  local size = held and cjson.decode(held).bytes or 0
  redis.call('DEL', p .. 'records:' .. gone, p .. 'timeline:' .. gone)
  redis.call('HDEL', totals, gone)
  redis.call('ZREM', seen, gone)
  redis.call('DECRBY', total, size)
end
return 1
"""
# Every session's totals in one reply: one string to decode, not thousands of replies.
_EVERY = """
return '[' .. table.concat(redis.call('HVALS', ARGV[1] .. 'totals'), ',') .. ']'
"""


@dataclass(slots=True)
class _Queued:
    """A session's changes not sent yet, merged: counts summed (in the order of the script's
    `counts`), the last fields set, the documents in order (no more than Redis keeps of them)."""

    now: float
    counts: list[int]
    fields: list[str | int | None]
    records: list[Document] = field(default_factory=list)
    timeline: list[Document] = field(default_factory=list)


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
        self._per_session = per_session
        self._bounds = (per_session, max_sessions, max_bytes, SESSION_BYTES)
        self._errors = metrics.errors.labels(backend="redis", operation="records")
        self._tasks = tasks
        self._prefix = prefix
        self._queued: dict[str, _Queued] = {}  # in the order first queued
        self._max_pending = max_pending
        self._sender: asyncio.Task[None] | None = None
        self._client: aioredis.Redis | None = None
        self._scripts: tuple[AsyncScript, AsyncScript] | None = None
        self._failing = False  # said once per outage

    async def open(self) -> None:
        self._client = self._redis.get()
        self._scripts = (
            self._client.register_script(_ADD),
            self._client.register_script(_EVERY),
        )

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
            self._sender = None  # cancelled before it ran, it could not say so itself
        if self._client is not None and self._queued:
            await self._send_queued()  # what the last requests added: one try, bounded by timeout
        self._client = None
        await self._redis.close()

    # -- writes ----------------------------------------------------------------------------

    def add(self, session_id: str, change: SessionChange, now: float) -> None:
        queued = self._queued.get(session_id)
        if queued is None:
            if len(self._queued) >= self._max_pending:
                _, dropped = self._pop_oldest()
                self._errors.inc(1 + len(dropped.records) + len(dropped.timeline))
            queued = self._queued[session_id] = _Queued(now, [0] * 7, [None] * 3)
        queued.now = max(queued.now, now)
        counts = queued.counts
        counts[0] += change.requests
        counts[1] += change.records
        counts[2] += change.summarizer_calls
        counts[3] += change.summarizer_failures
        counts[4] += change.pinned_overflow
        counts[5] += change.tokens_sent
        counts[6] += change.tokens_forwarded
        for i, value in enumerate((change.dialect, change.model, change.window)):
            if value is not None:
                queued.fields[i] = value
        # Redis keeps the newest `per_session` of each: no more need to wait here.
        if change.record is not None:
            _append(queued.records, change.record, self._per_session)
        if change.timeline is not None:
            _append(queued.timeline, change.timeline, self._per_session)
        if self._sender is None and self._client is not None and not self._tasks.closed:
            self._sender = self._tasks.spawn(self._send(), name="state-redis-records")

    def _pop_oldest(self) -> tuple[str, _Queued]:
        session_id = next(iter(self._queued))
        return session_id, self._queued.pop(session_id)

    async def _send(self) -> None:
        try:
            await self._send_queued()
        finally:
            self._sender = None

    async def _send_queued(self) -> None:
        while self._queued:
            batch = [self._pop_oldest() for _ in range(min(len(self._queued), _BATCH))]
            try:
                await self._write(batch)
            except Exception as exc:  # Redis down or slow: dropped, counted, said once
                self._errors.inc(sum(1 + len(q.records) + len(q.timeline) for _, q in batch))
                if not self._failing:
                    self._failing = True
                    log.warning("session records not written to redis", extra={"error": repr(exc)})
            else:
                self._failing = False

    async def _write(self, batch: Sequence[tuple[str, _Queued]]) -> None:
        client, (add, _) = self._require()
        async with client.pipeline(transaction=False) as pipe:
            for session_id, queued in batch:
                await add(keys=[], args=self._arguments(session_id, queued), client=pipe)
            await pipe.execute()

    def _arguments(self, session_id: str, queued: _Queued) -> list[str | int | bytes]:
        return [
            self._prefix,
            session_id,
            repr(queued.now),
            *self._bounds,
            *queued.counts,
            *("" if value is None else str(value) for value in queued.fields),
            len(queued.records),
            *(orjson.dumps(record, default=repr) for record in queued.records),
            *(orjson.dumps(line, default=repr) for line in queued.timeline),
        ]

    # -- reads -----------------------------------------------------------------------------

    async def newest(self, offset: int, limit: int) -> tuple[list[tuple[str, SessionTotals]], int]:
        client, _ = self._require()
        seen = self._prefix + "seen"
        if limit <= 0:
            return [], int(await client.zcard(seen))
        async with client.pipeline(transaction=False) as pipe:
            pipe.zcard(seen)
            pipe.zrevrange(seen, offset, offset + limit - 1)
            total, ids = await pipe.execute()
        if not ids:
            return [], int(total)
        found = await client.hmget(self._prefix + "totals", ids)
        shown = [orjson.loads(totals) for totals in found if totals is not None]
        return [_totals_of(totals) for totals in shown], int(total)

    async def every(self) -> list[tuple[str, SessionTotals]]:
        _, (_, every) = self._require()
        shown: list[dict[str, Any]] = orjson.loads(await every(keys=[], args=[self._prefix]))
        shown.sort(key=lambda totals: totals["last_seen"], reverse=True)
        return [_totals_of(totals) for totals in shown]

    async def session(self, session_id: str) -> SharedSession | None:
        client, _ = self._require()
        p = self._prefix
        async with client.pipeline(transaction=False) as pipe:
            pipe.hget(p + "totals", session_id)
            pipe.lrange(f"{p}records:{session_id}", 0, -1)
            pipe.lrange(f"{p}timeline:{session_id}", 0, -1)
            totals, records, timeline = await pipe.execute()
        if totals is None:
            return None
        return SharedSession(
            totals=_totals_of(orjson.loads(totals))[1],
            records=[orjson.loads(record) for record in records],
            timeline=[orjson.loads(line) for line in timeline],
        )

    def _require(self) -> tuple[aioredis.Redis, tuple[AsyncScript, AsyncScript]]:
        if self._client is None or self._scripts is None:
            raise ConnectionError("the shared records are not open")
        return self._client, self._scripts


def _append(documents: list[Document], document: Document, keep: int) -> None:
    documents.append(document)
    if len(documents) > keep:
        del documents[0]


def _totals_of(totals: dict[str, Any]) -> tuple[str, SessionTotals]:
    """A session's id and totals from the document the script keeps (fields never set absent)."""
    return totals["session_id"], SessionTotals(
        first_seen=totals["first_seen"],
        last_seen=totals["last_seen"],
        requests=totals["requests"],
        records_total=totals["records_total"],
        records_kept=totals["records_kept"],
        dialect=totals.get("dialect"),
        model=totals.get("model"),
        window=totals.get("window"),
        tokens_sent=totals["tokens_sent"],
        tokens_forwarded=totals["tokens_forwarded"],
        summarizer_calls=totals["summarizer_calls"],
        summarizer_failures=totals["summarizer_failures"],
        pinned_overflow=totals["pinned_overflow"],
    )
