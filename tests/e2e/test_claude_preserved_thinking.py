"""The real Claude Code on a model that binds its thinking to its prefix (`claude-opus-5-5`,
matched by the default globs of `models.preserved_thinking`), through the proxy, against the
strict fake of Anthropic's rules (tests/fakes/anthropic_strict.py: the prefix check of platform
docs `build-with-claude/preserved-thinking` and `.../preserved-thinking/prefix-checks`, the
window check on prompt + `max_tokens`).

One `claude -p` conversation, then resumed (`--continue`): a tool loop whose shell outputs grow
it past the trigger several times; after the first compaction the model asks `recall` once for
a folded output, and the proxy answers it in a hidden round. Every request the client sent is
answered 200, the strict
upstream refuses none (neither the agent's nor the proxy's summary calls), the conversation was
compacted (records and `x-compaction-status`), and the recall round happened and answered with
the folded output.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from compaction import SUMMARY_MARKER
from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.settings import Settings
from tests.e2e.apis import DONE, shell_command
from tests.e2e.conftest import ADMIN_TOKEN, client_binary
from tests.e2e.test_clients import FOLLOW_UP, run
from tests.fakes.anthropic_strict import StrictAnthropic

MODEL = "claude-opus-5-5"
# Claude Code 2.1.332 asks Opus 5.5 for `max_tokens` 128,000 (on a 400 for the window it asks
# again with less); an absolute trigger well below the window's end leaves it that room (what
# docs/configuration.md advises for large windows) and compacts after a few steps.
WINDOW = 200_000
TRIGGER = 40_000
STEPS = 22
LINES = 900  # ~27,000 characters a step: under Claude Code's 30,000-character Bash cut
RECALLED = "alpha beta gamma"
TASK = (
    "Run the step the model asks for each time and report when every step ran; the folder is "
    "scratch space. Task: tally the words."
)
_TURN = re.compile(r"turn (\d+) alpha")
_RECALL_ID = "toolu_recall_e2e"


@dataclass
class ClaudeCodeLoop:
    """The model's side of the conversation: think, then run the next step with `Bash` (the
    step after the highest whose output it has seen, folded or not) until `steps` ran, then
    answer DONE; once the conversation is compacted, ask `recall` for a folded output first,
    once."""

    steps: int = STEPS
    recalled: list[Any] = field(default_factory=list)
    """The content of the recall result the model read, per round."""

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        messages = payload.get("messages") or []
        text = orjson.dumps(messages).decode()
        tools = {t.get("name") for t in payload.get("tools") or []}
        result = _recall_result(messages)
        if result is not None and not self.recalled:
            self.recalled.append(result)
        if "Bash" not in tools:  # a side request of Claude Code's: just answer
            return [{"type": "text", "text": "ok"}]
        if "recall" in tools and SUMMARY_MARKER in text and not self.recalled:
            return [
                {"type": "thinking", "thinking": "That output was folded away; recall it."},
                {"type": "text", "text": "Checking an earlier output. "},
                {"type": "tool_use", "id": _RECALL_ID, "name": "recall",
                 "input": {"query": RECALLED}},
            ]  # fmt: skip
        step = max((int(n) for n in _TURN.findall(text)), default=-1) + 1
        if step >= self.steps:
            return [
                {"type": "thinking", "thinking": "Every step ran."},
                {"type": "text", "text": DONE},
            ]
        command = {"command": shell_command(step, LINES), "description": "print words"}
        return [
            {"type": "thinking", "thinking": f"Step {step} is next."},
            {"type": "text", "text": f"Running step {step}."},
            {"type": "tool_use", "id": f"toolu_step{step}", "name": "Bash", "input": command},
        ]


def _recall_result(messages: list[Any]) -> Any:
    for message in messages:
        for block in message.get("content") if isinstance(message.get("content"), list) else []:
            if isinstance(block, dict) and block.get("tool_use_id") == _RECALL_ID:
                return block.get("content")
    return None


@dataclass
class StrictStack:
    api: StrictAnthropic
    loop: ClaudeCodeLoop
    proxy_url: str
    http: aiohttp.ClientSession

    async def session(self) -> dict[str, Any]:
        """The one session the proxy saw, with its records and timeline."""
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with self.http.get(f"{self.proxy_url}/admin/sessions", headers=headers) as listed:
            sessions = (await listed.json())["sessions"]
        assert len(sessions) == 1, sessions
        url = f"{self.proxy_url}/admin/api/sessions/{sessions[0]['session_id']}"
        async with self.http.get(url, headers=headers) as response:
            found: dict[str, Any] = await response.json()
        return found


@pytest.fixture
async def strict_stack(tmp_path: Path) -> AsyncIterator[StrictStack]:
    loop = ClaudeCodeLoop()
    async with StrictAnthropic(window=WINDOW, turn=loop) as api:
        settings = Settings.build(
            {
                "upstream": {"base_url": api.base_url, "anthropic_base_url": api.base_url},
                "models": {"context_windows": {MODEL: WINDOW}},
                # Every compaction asks the model, so the summary calls meet the strict fake.
                "compaction": {"strategy": "summary", "recall": "on", "trigger_tokens": TRIGGER},
                "memory": {"dir": str(tmp_path / "memory")},
                "state": {"backend": "memory"},
                "admin": {"token": ADMIN_TOKEN},
            }
        )
        runner: web.AppRunner | None = None
        try:
            runner, url = await serve_on_loopback(create_app(settings))
            async with aiohttp.ClientSession() as http:
                yield StrictStack(api, loop, url, http)
        finally:
            if runner is not None:
                await runner.cleanup()


@pytest.mark.timeout(300)
async def test_claude_code_on_a_preserved_thinking_model_is_compacted_and_recalls_unrefused(
    strict_stack: StrictStack, tmp_path: Path
) -> None:
    assert Settings.build({}).models.has_preserved_thinking(MODEL)  # the default globs
    claude = client_binary("claude")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "ANTHROPIC_BASE_URL": strict_stack.proxy_url,  # no /v1: Claude Code adds it
        "ANTHROPIC_API_KEY": "sk-e2e",
        "HOME": str(tmp_path),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "IS_SANDBOX": "1",  # lets root skip the permission prompts
    }
    flags = ("--model", MODEL, "--dangerously-skip-permissions")
    out = await run((claude, "-p", *flags, TASK), env, work)
    assert DONE in out, out[-2000:]
    api = strict_stack.api
    # Resumed: the compacted conversation and its thinking, sent back by a new client process.
    sent = len(api.requests)
    out = await run((claude, "-p", *flags, "--continue", FOLLOW_UP), env, work)
    assert DONE in out, out[-2000:]
    assert FOLLOW_UP in orjson.dumps(api.requests[-1]["messages"]).decode()
    assert len(api.requests) > sent

    # No request refused by the strict upstream: the agent's, or the proxy's summary calls.
    assert api.refused == []
    assert api.own_calls, "no summary was asked"
    # Every request the client sent was answered 200 (the upstream's answer, relayed).
    session = await strict_stack.session()
    timeline = session["timeline"]
    assert timeline and {line["upstream_status"] for line in timeline} == {200}
    # Compacted, more than once (the tool loop grew past the trigger again).
    compactions = {line["compaction_id"] for line in timeline if line["compaction_id"]}
    assert len(compactions) >= 2, timeline
    assert {line["status"] for line in timeline} >= {"applied", "reused"}
    assert session["records"], "no compaction record"
    summarized = [r for r in api.requests if SUMMARY_MARKER in orjson.dumps(r["messages"]).decode()]
    assert summarized
    # The recall round: answered in a hidden round, with the folded output as its content, and
    # the client's later requests (the thinking written after it sent back) accepted.
    assert sum(line["recall_rounds"] for line in timeline) == 1
    assert len(strict_stack.loop.recalled) == 1
    assert RECALLED in orjson.dumps(strict_stack.loop.recalled[0]).decode()
    rounds = [i for i, r in enumerate(api.requests) if _recall_result(r["messages"]) is not None]
    assert rounds[0] < len(api.requests) - 1, "nothing was asked after the recall round"
    assert api.readable > 0  # thinking sent back on the compacted prefix is read
