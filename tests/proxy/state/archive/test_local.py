"""The archive in the process (`state.backend: memory`) is bounded over all its sessions, not only
per session: by `archive.memory_max_mb` (and `archive.max_total_mb`), and by the age for sessions
no longer archived."""

from __future__ import annotations

from proxy.state.archive import Scope
from proxy.state.archive.local import LocalArchive
from tests.proxy.state.archive.conftest import Clock, entry

FIRST = Scope("agent-1", "aa" * 16)
SECOND = Scope("agent-2", "aa" * 16)


def turns(start: int, count: int, *, at: float = 1_000_000.0) -> list:  # type: ignore[type-arg]
    return [entry(i, f"turn{i} " + "x" * 94, at=at) for i in range(start, start + count)]


async def indexes(archive: LocalArchive, scope: Scope) -> list[int]:
    query = " ".join(f"turn{i}" for i in range(20))
    found = await archive.search(scope.session, query, tenant=scope.tenant, limit=50)
    return sorted(item.index for item in found if item.index is not None)


async def test_beyond_the_total_bound_the_least_recently_archived_session_goes_first() -> None:
    one = LocalArchive(max_bytes=1, max_age_s=1).weight(turns(0, 1)[0])
    archive = LocalArchive(
        max_bytes=one * 100, max_age_s=86400, max_total_bytes=one * 6 + one // 2, clock=Clock()
    )
    assert (await archive.add(FIRST, turns(0, 4)))["total"] == 0
    assert (await archive.add(SECOND, turns(0, 2)))["total"] == 0
    assert (await archive.add(FIRST, turns(4, 1)))["total"] == 2  # SECOND was the older
    assert await indexes(archive, SECOND) == []
    assert await indexes(archive, FIRST) == [0, 1, 2, 3, 4]


async def test_a_session_no_longer_archived_still_ages_out() -> None:
    clock = Clock()
    archive = LocalArchive(max_bytes=1 << 20, max_age_s=100, clock=clock)
    await archive.add(FIRST, turns(0, 2, at=clock.now))
    clock.now += 150
    dropped = await archive.add(SECOND, turns(0, 1, at=clock.now))
    assert dropped["age"] == 2
    assert await indexes(archive, FIRST) == []
    assert await indexes(archive, SECOND) == [0]
