"""`compaction-proxy inspect` (proxy.admin.inspect) against a running proxy that compacted."""

from __future__ import annotations

import io
import re
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.admin.inspect import InspectError, inspect, main
from proxy.cli import _parser
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post

TOKEN = "admin-secret"
README = Path(__file__).resolve().parents[3] / "README.md"


async def test_inspect_shows_the_sessions_and_a_sessions_timeline_and_last_compaction(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    proxy = await start(compaction={"summary_request": "standalone"})
    await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    await post(client, proxy, conversation_of(200), session="quiet")
    async with client.get(
        f"{proxy.url}/admin/api/sessions/agent-1", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as response:
        found = await response.json()

    table = io.StringIO()
    await inspect(proxy.url, TOKEN, None, table, sort="tokens_saved")
    lines = table.getvalue().splitlines()
    assert lines[0].startswith("requests 2  in flight 0")
    assert "state healthy" in lines[0]
    assert lines[2].split()[:3] == ["session", "dialect", "model"]
    first = lines[3].split()
    assert first[:5] == ["agent-1", "chat", "gpt-test", "1", "1"]
    assert first[5:8] == [
        f"{found[k]:,}" for k in ("tokens_sent", "tokens_forwarded", "tokens_saved")
    ]
    assert lines[4].split()[0] == "quiet"
    assert lines[-1] == "2 of 2 sessions"

    one = io.StringIO()
    await inspect(proxy.url, TOKEN, "agent-1", one)
    text = one.getvalue()
    (record,) = found["records"]
    assert f"window {WINDOW:,}  trigger {int(WINDOW * 0.85):,}" in text
    (timeline_line,) = [line for line in text.splitlines() if " applied " in line]
    assert f"{record['tokens_before']:,}" in timeline_line
    assert f"{record['tokens_after']:,}" in timeline_line
    assert f"last compaction {record['id']}" in text and "path llm" in text
    assert "  - Keep the standard library only." in text
    assert "  decision: Keep the standard library only." in text
    assert f"diff: {record['diff']['removed_total']} messages as sent" in text
    assert "+ [1] user: [compaction-proxy: summary of earlier conversation]" in text
    assert "- [1] user: " in text

    quiet = io.StringIO()
    await inspect(proxy.url, TOKEN, "quiet", quiet)
    assert "no compaction yet" in quiet.getvalue() and " none " in quiet.getvalue()
    with pytest.raises(InspectError, match="404"):
        await inspect(proxy.url, TOKEN, "nobody", io.StringIO())


async def test_inspect_says_when_the_token_is_refused_and_never_shows_it(start: Any) -> None:
    proxy = await start()
    with pytest.raises(InspectError) as refused:
        await inspect(proxy.url, "not-the-token", None, io.StringIO())
    assert "refused (401)" in str(refused.value) and "not-the-token" not in str(refused.value)


def test_inspect_needs_a_token_and_a_reachable_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["inspect"])
    assert main(args, {}) == 2
    assert "no admin token" in capsys.readouterr().err
    with socket.socket() as free:  # bound, never listening: the connection is refused
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        args = _parser().parse_args(["inspect", "s1", "--url", f"http://127.0.0.1:{port}"])
        assert main(args, {"COMPACTION_PROXY_ADMIN_TOKEN": "secret-value"}) == 1
    err = capsys.readouterr().err
    assert err.startswith("compaction-proxy inspect: cannot read") and "secret-value" not in err


def _shape(line: str) -> str:
    """A line of inspect's output less what changes from run to run: times, ids, figures,
    and the padding that follows their widths."""
    line = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", "TIME", line)
    line = re.sub(r"\b[0-9a-f]{32}\b", "ID", line)
    line = re.sub(r"\$?\d[\d,.]*%?", "N", line)
    return " ".join(line.split())


async def test_the_readme_shows_inspect_as_it_prints_a_compacted_session(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    """The README's example is current: its session (the scripted one below) printed today has
    every line the README shows, in the same order, figures and times aside; the texts of the
    summary, the memory items and the diff (indented, or a diff's - and + lines) are the
    fakes', not checked."""
    proxy = await start()
    first = conversation_of(int(WINDOW * 1.2))
    await post(client, proxy, first)
    await post(client, proxy, conversation_of(int(WINDOW * 1.28), grow=first))
    out = io.StringIO()
    await inspect(proxy.url, TOKEN, "agent-1", out)
    printed = iter([_shape(line) for line in out.getvalue().splitlines()])

    readme = README.read_text(encoding="utf-8")
    block = readme.split("$ compaction-proxy inspect agent-1\n", 1)[1].split("```", 1)[0]
    shown = [
        line
        for line in block.splitlines()
        if line.strip() and line != "..." and not line.startswith(("  ", "- [", "+ ["))
    ]
    assert len(shown) >= 12
    # In order: each line the README shows is printed, after the one before it.
    stale = [line for line in shown if _shape(line) not in printed]
    assert not stale, (
        f"README.md shows inspect lines it no longer prints, or not in this order: {stale}"
    )
