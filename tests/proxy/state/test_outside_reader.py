"""The live state file opened by another process while the proxy writes to it: the documented
`compaction-proxy recall` command and a plain SQLite reader (a backup, `sqlite3`). Neither may
take the proxy's write-ahead log away: closing any descriptor of the file drops every POSIX lock
the process holds on it (https://www.sqlite.org/howtocorrupt.html, section 2.2), and the next
process to close the database then believes itself the last, checkpoints and deletes the -wal
and -shm the proxy still writes to. A SIGKILL after that loses every write since."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tests import factories as f
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post
from tests.proxy.state.conftest import ProxyProcess, SpawnProxy

_READ_ELSEWHERE = """
import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as connection:
    print(connection.execute("SELECT count(*) FROM checkpoints").fetchone()[0])
connection.close()
"""


async def _run(*argv: str, cwd: Path) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        cwd=str(cwd),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


def _deleted_files(proxy: ProxyProcess, state: Path) -> list[str]:
    """The state file's files (-wal, -shm) the proxy holds open that no longer have a name."""
    fds = Path(f"/proc/{proxy.pid}/fd")
    links = []
    for fd in os.listdir(fds):
        try:
            links.append(os.readlink(fds / fd))
        except FileNotFoundError:  # closed meanwhile
            continue
    return [link for link in links if link.startswith(str(state)) and link.endswith("(deleted)")]


async def test_the_wal_survives_an_outside_reader_and_a_sigkill_after_it(
    spawn: SpawnProxy, script: Script, client: Any, tmp_path: Path
) -> None:
    proxy = await spawn()
    state = tmp_path / "state.sqlite3"
    messages = conversation_of(int(WINDOW * 1.1))
    first = await post(client, proxy, messages, session="agent-1")
    assert first.headers["x-compaction-status"] == "applied"

    # The documented command, then a plain reader, each in a process of its own, each opening
    # and closing the file while the proxy serves.
    out = await _run("-m", "proxy", "--config", str(proxy.config), "recall", "agent-1", "round",
                     cwd=tmp_path)  # fmt: skip
    assert "turn" in out
    assert int(await _run("-c", _READ_ELSEWHERE, str(state), cwd=tmp_path)) >= 1

    second = await post(client, proxy, messages, session="agent-2")
    assert second.headers["x-compaction-status"] == "applied"
    assert Path(f"{state}-wal").exists()
    assert _deleted_files(proxy, state) == []

    await proxy.stop(signal.SIGKILL)
    await proxy.start()
    grown = [*messages, f.assistant("ok"), f.user("go on, agent-2")]
    again = await post(client, proxy, grown, session="agent-2")
    assert again.headers["x-compaction-status"] == "reused"
    assert again.headers["x-compaction-id"] == second.headers["x-compaction-id"]
    assert len(script.calls("summary")) == 2
