"""Memory folders of sessions idle past an age are removed (compaction.prune_memory), and a
session written again afterwards starts a new, private folder."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from compaction import MemoryItem, MemoryWriter, prune_memory

DAY = 86400.0


async def test_an_idle_sessions_folder_is_pruned_and_a_later_write_starts_afresh(
    tmp_path: Path,
) -> None:
    writer = MemoryWriter(tmp_path)
    await writer.write("s1", "c1", [MemoryItem("fact", "the ledger uses postgres 16")])
    await writer.write("s2", "c1", [MemoryItem("fact", "the cache is redis")])
    assert prune_memory(tmp_path, 30 * DAY, now=time.time()) == []
    assert sorted(prune_memory(tmp_path, 30 * DAY, now=time.time() + 31 * DAY)) == ["s1", "s2"]
    assert list(tmp_path.iterdir()) == []
    await writer.write("s1", "c2", [MemoryItem("decision", "ship on friday")])
    lines = (tmp_path / "s1" / "compaction_flush.jsonl").read_text().splitlines()
    assert len(lines) == 1 and "ship on friday" in lines[0]
    assert stat.S_IMODE((tmp_path / "s1").stat().st_mode) == 0o700


def test_a_missing_root_prunes_nothing(tmp_path: Path) -> None:
    assert prune_memory(tmp_path / "absent", DAY, now=time.time()) == []
