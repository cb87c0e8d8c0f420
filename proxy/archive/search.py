"""One search over a session's archive and its memory items, and the one place an archive backend
is chosen from settings (the same `state.backend` as checkpoints: the same file or Redis)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy.archive.entries import Archive, Found
from proxy.archive.local import LocalArchive
from proxy.archive.memory_file import search_memory
from proxy.archive.terms import query_terms
from proxy.settings import ArchiveSettings, StateSettings


async def search_session(
    archive: Archive,
    memory_dir: Path,
    session: str,
    query: str,
    *,
    tenant: str | None,
    limit: int,
) -> list[Found]:
    """The archived turns and the memory items that match `query` best, at most `limit`.
    `tenant` (a credential's digest) keeps the search to what that credential archived, memory
    items included; None: the whole session (an operator)."""
    terms = query_terms(query)
    if not terms or limit <= 0:
        return []
    archived, compactions = await archive.find(session, query, tenant=tenant, limit=limit)
    items = await asyncio.to_thread(
        search_memory, memory_dir, session, terms, compactions=compactions, limit=limit
    )
    # Scores of two scorers: interleave by rank, the archive's first at equal rank.
    merged: list[Found] = []
    for pair in zip(archived, items, strict=False):
        merged.extend(pair)
    shorter = min(len(archived), len(items))
    merged.extend(archived[shorter:])
    merged.extend(items[shorter:])
    return merged[:limit]


def build_archive(
    state: StateSettings, archive: ArchiveSettings, *, read_only: bool = False
) -> Archive:
    """The archive of `state.backend`, bounded as `archive` says; `read_only`: a reader beside
    a running proxy (the state file opened `mode=ro`)."""
    max_bytes, max_age_s = archive.max_bytes_per_session, archive.max_age_s
    if state.backend == "sqlite":
        from proxy.archive.sqlite import SqliteArchive

        return SqliteArchive(
            state.path, max_bytes=max_bytes, max_age_s=max_age_s, read_only=read_only
        )
    if state.backend == "redis":
        from proxy.archive.redis import RedisArchive

        assert state.redis_url is not None  # settings refuse redis without a URL
        return RedisArchive(
            state.redis_url, max_bytes=max_bytes, max_age_s=max_age_s, timeout_s=state.timeout_s
        )
    return LocalArchive(
        max_bytes=max_bytes, max_age_s=max_age_s, max_total_bytes=archive.memory_max_bytes
    )
