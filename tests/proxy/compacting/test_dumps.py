"""logging.dump_dir: compacted requests dumped as received and as compacted, credentials
redacted, the folder bounded, a failing dump never failing its request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from proxy.compacting.background.dumps import REDACTED, Dump, RequestDumps
from proxy.tasks import BackgroundTasks
from tests import factories as f
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, wait_for


def _dumped(folder: Path, part: str) -> list[Path]:
    return sorted(folder.glob(f"*.{part}.json"))


async def test_compacted_requests_are_dumped_as_received_and_as_forwarded_without_credentials(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "dumps"
    proxy = await start(logging={"dump_dir": str(folder)})
    await post(client, proxy, conversation_of(WINDOW // 4), session="small")  # not compacted
    first = conversation_of(int(WINDOW * 1.1))
    second = [*first, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    for messages in (first, second):
        await post(client, proxy, messages, auth="Bearer sk-client-secret")
    await wait_for(lambda: len(_dumped(folder, "meta")) == 2)

    sent = [orjson.dumps({"model": "gpt-test", "messages": m}) for m in (first, second)]
    forwarded = [r.body for r in script.calls(None)][1:]
    assert [p.read_bytes() for p in _dumped(folder, "received")] == sent
    assert [p.read_bytes() for p in _dumped(folder, "compacted")] == forwarded
    metas = [orjson.loads(p.read_bytes()) for p in _dumped(folder, "meta")]
    assert [m["x-compaction-status"] for m in metas] == ["applied", "reused"]
    assert all(m["headers"]["Authorization"] == REDACTED for m in metas)
    assert all(m["route"] == "chat" and m["x-compaction-session"] == "agent-1" for m in metas)
    assert not any(b"sk-client-secret" in p.read_bytes() for p in folder.iterdir())
    # They are conversations: this user's only.
    assert folder.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o600}


async def test_shadow_requests_are_dumped_with_what_on_would_forward(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "dumps"
    proxy = await start(compaction={"mode": "shadow"}, logging={"dump_dir": str(folder)})
    messages = conversation_of(int(WINDOW * 1.1))
    await post(client, proxy, messages)
    await wait_for(lambda: len(_dumped(folder, "meta")) == 1)
    sent = orjson.dumps({"model": "gpt-test", "messages": messages})
    assert script.calls(None)[-1].body == sent
    (received,), (compacted,) = _dumped(folder, "received"), _dumped(folder, "compacted")
    assert received.read_bytes() == sent
    assert len(compacted.read_bytes()) < len(sent)
    meta = orjson.loads(_dumped(folder, "meta")[0].read_bytes())
    assert meta["x-compaction-status"] == "shadow"


async def test_a_dump_that_cannot_be_written_never_fails_the_request(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a folder")
    proxy = await start(logging={"dump_dir": str(in_the_way / "dumps")})
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.1)))
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"


def _one(session: str, size: int) -> Dump:
    return Dump(session, b"r" * size, b"c" * size, {"x-compaction-status": "applied"}, {})


async def test_the_folder_keeps_the_newest_dumps_within_the_file_count(tmp_path: Path) -> None:
    dumps = RequestDumps(tmp_path, max_files=6, max_bytes=1 << 20, tasks=BackgroundTasks())
    for i in range(5):
        dumps.write(_one(f"s{i}", 10))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 6
    assert {name.split(".")[0] for name in names} == {"00000004-s3", "00000005-s4"}


async def test_the_folder_keeps_within_its_size_across_a_restart(tmp_path: Path) -> None:
    def opened() -> RequestDumps:
        return RequestDumps(tmp_path, max_files=100, max_bytes=2500, tasks=BackgroundTasks())

    first = opened()
    first.write(_one("a", 500))
    first.write(_one("b", 500))
    again = opened()  # counts what the folder already holds
    again.write(_one("c", 500))
    again.write(_one("too/big", 2000))  # larger than the whole budget: not written
    stems = {p.name.split(".")[0] for p in tmp_path.iterdir()}
    assert stems == {"00000002-b", "00000003-c"}
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 2500
