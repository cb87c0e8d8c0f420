"""Reading a long request's items for proxy.compacting.fast.indexes: where each item sits in the
body, its chained prefix digest and the cumulative token estimate. Its cost grows with the body,
so it is a job for an Offload (another process may run it): plain data in, plain data out."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import orjson

from compaction import HeuristicEstimator, Shape, prefix_digests
from proxy.compacting.fast.parts import is_same, other_fields
from proxy.compacting.fast.spans import Items, locate_value, scan_items


@dataclass(frozen=True)
class IndexJob:
    body: bytes
    key: bytes
    seed: bytes
    shape: Shape


@dataclass(frozen=True)
class Indexed:
    open_at: int
    items: Items
    digests: list[bytes]
    tokens: list[int]


def index_body(job: IndexJob) -> Indexed | None:
    """Where the items of `job.body` are, their prefix digests and cumulative counts; None when
    the bytes cannot be followed. A job for an Offload (another process may run it)."""
    body = job.body
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    key = orjson.loads(job.key)
    messages = payload.get(key) if isinstance(payload, dict) else None
    open_at = locate_value(body, job.key)
    items = scan_items(body, open_at) if open_at is not None else None
    if not isinstance(messages, list) or open_at is None or items is None:
        return None
    if len(items.starts) != len(messages) or (messages and not is_same(body, items, messages)):
        return None
    if other_fields(body, open_at, items.close, key) is None:  # a second list: the parser's
        return None
    count = HeuristicEstimator(shape=job.shape).count_message
    return Indexed(
        open_at=open_at,
        items=items,
        digests=prefix_digests(messages, job.seed),
        tokens=list(itertools.accumulate((count(m) for m in messages), initial=0)),
    )
