"""Every archive backend, built the way `build_state` builds it, on a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from proxy.state.archive import Archive, Entry, Kind
from proxy.state.archive.local import LocalArchive
from proxy.state.archive.redis import RedisArchive
from proxy.state.archive.sqlite import SqliteArchive
from proxy.state.redis_client import RedisClient
from proxy.state.sqlite_file import StateFile
from tests.proxy.state.conftest import RedisServer, free_port, redis_binary

BACKENDS = ("memory", "sqlite", "sqlite-like", "redis")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


MakeArchive = Callable[..., Archive]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=BACKENDS)
async def make_archive(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> AsyncIterator[MakeArchive]:
    """`make_archive(max_bytes=..., max_age_s=..., max_total_bytes=...)`: an archive of the
    parametrized backend (opened by the test), closed at the end."""
    backend: str = request.param
    opened: list[Archive] = []
    server: RedisServer | None = None
    if backend == "redis":
        server = RedisServer(redis_binary(), free_port())
        await server.start()

    def make(
        *, max_bytes: int = 1 << 20, max_age_s: float = 86400.0, max_total_bytes: int | None = None
    ) -> Archive:
        archive: Archive
        if backend == "memory":
            archive = LocalArchive(
                max_bytes=max_bytes,
                max_age_s=max_age_s,
                max_total_bytes=max_total_bytes,
                clock=clock,
            )
        elif backend.startswith("sqlite"):
            archive = SqliteArchive(
                StateFile(tmp_path / "state.sqlite3", clock=clock),
                max_bytes=max_bytes,
                max_age_s=max_age_s,
                max_total_bytes=max_total_bytes,
                full_text=backend == "sqlite",
                clock=clock,
            )
        else:
            assert server is not None
            client = RedisClient(server.url, timeout_s=2, max_connections=32)
            archive = RedisArchive(
                client,
                max_bytes=max_bytes,
                max_age_s=max_age_s,
                max_total_bytes=max_total_bytes,
                clock=clock,
            )
        opened.append(archive)
        return archive

    yield make
    for archive in opened:
        await archive.close()
    if server is not None:
        await server.stop()


def entry(index: int, text: str, *, kind: Kind = "message", at: float = 1_000_000.0,
          compaction_id: str = "c1") -> Entry:  # fmt: skip
    body = '{"role":"user","content":' + repr(text).replace("'", '"') + "}"
    return Entry.of(index, "chat", kind, compaction_id, at, body, text)
