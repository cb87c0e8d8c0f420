"""One search over a session's archive and its memory items."""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy.state.archive.entries import Archive, Found
from proxy.state.archive.memory_file import search_memory
from proxy.state.archive.terms import query_terms


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
