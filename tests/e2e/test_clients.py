"""The real Codex CLI and Claude Code through the proxy, against the scripted APIs (conftest):
two conversations from one folder and key, then the last one resumed. Per client: one session
per conversation and never two conversations in one, compaction applied, every forwarded request
valid for its API, the client finishes, the task verbatim after the resume."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from compaction import PREVIEW_MARK, SUMMARY_MARKER
from tests.e2e.apis import DONE
from tests.e2e.conftest import Stack, client_binary

TASKS = (
    "Run the step the model asks for each time and report when every step ran; the folder is "
    "scratch space. Task one: tally the words.",
    "Run the step the model asks for each time and report when every step ran; the folder is "
    "scratch space. Task two: tally the lines.",
)
FOLLOW_UP = "Now do it once more, the same way."
_CLIENT_TIMEOUT_S = 240


async def run(argv: Sequence[str | Path], env: dict[str, str], cwd: Path) -> str:
    """The client's output; it must exit 0 within the timeout."""
    process = await asyncio.create_subprocess_exec(
        *map(str, argv),
        env={**os.environ, **env},
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=_CLIENT_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    text = out.decode(errors="replace")
    assert process.returncode == 0, text[-4000:]
    return text


async def check_conversations(
    stack: Stack, path: str, runs: Sequence[Sequence[str | Path]], env: dict[str, str], cwd: Path
) -> None:
    """Runs `runs` (two new conversations, then the second one resumed) and checks them."""
    sessions: list[str] = []
    for number, argv in enumerate(runs):
        before = await stack.sessions()
        seen = len(stack.apis.agent_requests(path))
        out = await run(argv, env, cwd)
        assert DONE in out, out[-2000:]
        after = await stack.sessions()
        grown = {s for s, count in after.items() if count != before.get(s)}
        requests = stack.apis.agent_requests(path)[seen:]
        assert requests, "the client sent nothing through the proxy"
        texts = [orjson.dumps(r.body).decode() for r in requests]
        if number < 2:  # a new conversation: one new session, no other touched
            assert len(grown) == 1 and not grown & set(before), (before, after)
            sessions += grown
            records = await stack.records(next(iter(grown)))
            # A summary, or previews where they make room enough (the scripted steps print long
            # outputs: with `hybrid`, Codex's conversations compact by previews).
            applied = [t for t in texts if SUMMARY_MARKER in t or PREVIEW_MARK in t]
            assert applied, f"no compaction reached the upstream: {records}"
        else:  # the resumed conversation: its own session, and the task verbatim in each request
            assert grown == {sessions[1]}, (sessions, before, after)
            for text in texts:
                assert TASKS[1] in text, "the task is missing after the resume"
            assert FOLLOW_UP in texts[-1]
        assert stack.apis.problems == []


@pytest.mark.timeout(3 * _CLIENT_TIMEOUT_S)
async def test_codex_cli_exec_and_resume(stack: Stack, tmp_path: Path) -> None:
    codex = client_binary("codex")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        'model = "gpt-e2e"\nmodel_provider = "proxy"\n\n[model_providers.proxy]\n'
        f'name = "proxy"\nbase_url = "{stack.proxy_url}/v1"\nenv_key = "E2E_KEY"\n'
        'wire_api = "responses"\n'
    )
    env = {"CODEX_HOME": str(home), "E2E_KEY": "sk-e2e"}
    flags = ("--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check")
    runs = [
        (codex, "exec", *flags, TASKS[0]),
        (codex, "exec", *flags, TASKS[1]),
        (codex, "exec", *flags, "resume", "--last", FOLLOW_UP),
    ]
    await check_conversations(stack, "/v1/responses", runs, env, work)


@pytest.mark.timeout(3 * _CLIENT_TIMEOUT_S)
async def test_claude_code_print_and_continue(stack: Stack, tmp_path: Path) -> None:
    claude = client_binary("claude")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "ANTHROPIC_BASE_URL": stack.proxy_url,  # no /v1: Claude Code adds it
        "ANTHROPIC_API_KEY": "sk-e2e",
        "HOME": str(tmp_path),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "IS_SANDBOX": "1",  # lets root skip the permission prompts
    }
    flags = ("--model", "claude-e2e", "--dangerously-skip-permissions")
    runs = [
        (claude, "-p", *flags, TASKS[0]),
        (claude, "-p", *flags, TASKS[1]),
        (claude, "-p", *flags, "--continue", FOLLOW_UP),
    ]
    await check_conversations(stack, "/v1/messages", runs, env, work)
