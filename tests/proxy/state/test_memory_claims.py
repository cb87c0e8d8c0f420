"""The memory writer's shared claims (compaction.memory.ItemClaims), as a state backend serves
them: items claimed elsewhere are skipped, a claim store that fails costs no item, and items that
could not be written are given back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from compaction.memory import MemoryWriter
from compaction.types import MemoryItem


class Claims:
    def __init__(self, *, claimed: set[str] | None = None, broken: bool = False) -> None:
        self.claimed = claimed or set()
        self.broken = broken
        self.released: list[str] = []

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        if self.broken:
            raise ConnectionError("claims unavailable")
        fresh = {key for key in keys if key not in self.claimed}
        self.claimed |= fresh
        return fresh

    async def release(self, session_id: str, keys: Sequence[str]) -> None:
        self.released.extend(keys)
        self.claimed -= set(keys)


ITEMS = [MemoryItem("decision", "Ship on Friday."), MemoryItem("todo", "Write the changelog.")]


async def test_items_claimed_by_another_writer_are_skipped(tmp_path: Path) -> None:
    claims = Claims(claimed={"decision\x00ship on friday"})
    written = await MemoryWriter(tmp_path, claims=claims).append("s1", "c1", ITEMS)
    assert written == [ITEMS[1]]


async def test_a_claim_store_that_fails_costs_no_item(tmp_path: Path) -> None:
    written = await MemoryWriter(tmp_path, claims=Claims(broken=True)).append("s1", "c1", ITEMS)
    assert written == ITEMS


async def test_items_that_could_not_be_written_are_given_back(tmp_path: Path) -> None:
    claims = Claims()
    writer = MemoryWriter(tmp_path, claims=claims)
    await writer.append("s1", "c1", ITEMS[:1])
    path = writer.path_for("s1")
    path.unlink()
    path.mkdir()  # the file can no longer be opened for writing
    with pytest.raises(OSError):
        await writer.append("s1", "c2", ITEMS[1:])
    assert claims.released == ["todo\x00write the changelog"]
    assert claims.claimed == {"decision\x00ship on friday"}
