"""`memory.dir` is private and bounded like the archive: created 0700 (a listable root lists every
session id), each session's folder 0700, and a session's folder removed once idle past
`archive.max_age_days`, at start and then periodically."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from tests.fakes.script import Script
from tests.proxy.compacting.conftest import (
    WINDOW,
    conversation_of,
    post,
    script,
    small_window_proxies,
    wait_for,
)
from tests.proxy.conftest import StartProxy

__all__ = ["script"]  # the fixture

DAY = 86400


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_memory_dir_and_each_sessions_folder_are_created_private(
    start_proxy: StartProxy, tmp_path: Path, script: Script, client: Any
) -> None:
    root = tmp_path / "workspace" / "memory"
    start = small_window_proxies(start_proxy, tmp_path, recall="on")
    proxy = await start(memory={"dir": str(root)})
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.3)))
    assert response.headers["x-compaction-status"] == "applied"
    await wait_for(lambda: (root / "agent-1" / "compaction_flush.jsonl").exists())
    assert _mode(root) == 0o700
    assert _mode(root / "agent-1") == 0o700


def _session(root: Path, name: str, age_s: float) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    file = folder / "compaction_flush.jsonl"
    file.write_bytes(b'{"type": "fact", "content": "x"}\n')
    then = time.time() - age_s
    os.utime(file, (then, then))
    os.utime(folder, (then, then))
    return folder


async def test_memory_folders_idle_past_the_archives_age_go_and_the_others_stay(
    start_proxy: StartProxy, tmp_path: Path
) -> None:
    root = tmp_path / "memory"
    old = _session(root, "old-agent", 31 * DAY)
    recent = _session(root, "recent-agent", 29 * DAY)
    # A folder that is not a session's (a dot name) or holds something else is never touched.
    other = _session(root, ".not-a-session", 400 * DAY)
    cluttered = _session(root, "cluttered", 400 * DAY)
    (cluttered / "notes").mkdir()
    await start_proxy(memory={"dir": str(root)}, archive={"max_age_days": 30})
    await wait_for(lambda: not old.exists())
    assert recent.exists() and other.exists()
    assert (cluttered / "notes").exists() and (cluttered / "compaction_flush.jsonl").exists()
