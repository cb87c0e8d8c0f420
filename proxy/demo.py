"""`compaction-proxy demo`: the whole product offline, in under half a minute.

Starts a built-in fake upstream and the proxy on free loopback ports (memory files kept under
./workspace/demo/), drives a scripted coding-agent conversation with tool calls through it at a
small context window, and prints what happened at each request: tokens before and after, whether a
compaction was applied or reused, what each new summary added, and the memory file written.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import aiohttp
import orjson
from aiohttp import web

from compaction import SUMMARY_MARKER, Message
from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.outcome import PURPOSE, STATUS, TOKENS_AFTER, TOKENS_BEFORE
from proxy.settings import Settings

WINDOW = 6000


def _user_turns(prompt: list[Message]) -> list[str]:
    """The user entries of the transcript the proxy sent (its last message)."""
    text = str(prompt[-1].get("content", "")) if prompt else ""
    transcript = text.split("<transcript>", 1)[-1]
    return [
        turn.strip()
        for turn in re.findall(r"\[user\]\n(.*?)(?=\n\n\[|\n</transcript>|$)", transcript, re.S)
    ]


def _fake_summary(prompt: list[Message]) -> str:
    """What the fake upstream answers to a summary request: what it can see, structured. Like a
    real summarizer asked for an update, it carries the current summary's goals forward."""
    text = str(prompt[-1].get("content", "")) if prompt else ""
    current = re.search(r"<current_summary>\n## Goals and requests\n((?:- .*\n)*)", text)
    goals = current.group(1).splitlines() if current else []
    goals += [f"- {turn[:120]}" for turn in _user_turns(prompt)]
    paths = sorted(set(re.findall(r"[\w./-]+\.(?:py|toml|md)\b", text)))
    lines = ["## Goals and requests", *goals, "## Files touched", *(f"- {p}" for p in paths[:12])]
    lines += ["## Current state", "- Work on the date parser continues; the tests pass."]
    return "\n".join(lines)


def _fake_memory(prompt: list[Message]) -> str:
    """Like a real extractor: the sentence that states a preference, decision or todo, not the
    whole turn (a task that mentions a preference is not itself a preference)."""
    kinds = {"prefer": "preference", "decided": "decision", "agreed": "decision", "todo": "todo"}
    items = [
        {"type": kind, "content": sentence}
        for turn in _user_turns(prompt)
        for sentence in re.split(r"(?<=[.!?;])\s+", turn)
        for word, kind in kinds.items()
        if word in sentence.lower()
    ]
    return orjson.dumps(items).decode()


async def _fake_upstream(request: web.Request) -> web.Response:
    payload = await request.json()
    purpose = request.headers.get(PURPOSE)
    prompt = [m for m in payload["messages"] if isinstance(m, dict)]
    if purpose == "summary":
        text = _fake_summary(prompt)
    elif purpose == "memory":
        text = _fake_memory(prompt)
    else:
        text = "Understood. Continuing with the next step."
    return web.json_response(
        {
            "id": "chatcmpl-demo",
            "object": "chat.completion",
            "model": payload.get("model"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
        }
    )


def _script() -> list[list[Message]]:
    """Turns of a coding agent: each turn is what gets appended before the next request."""
    log = "\n".join(f"tests/test_dates.py::test_case_{i} PASSED" for i in range(40))
    source = "\n".join(
        f"def parse_{i}(text):\n    return text.split('-')[{i % 3}]" for i in range(30)
    )
    turns: list[list[Message]] = []
    tasks = [
        # The task is pinned after every summary: what later turns say is what gets folded.
        "Fix the date parser in src/dates.py: it crashes on '2024-02-30'.",
        "Now make parse_iso accept a trailing 'Z'. We decided to keep the stdlib only, no dateutil. I prefer pytest over unittest.",
        "Add a regression test for the leap-year case in tests/test_dates.py.",
        "TODO: document the new behaviour in docs/dates.md once tests pass.",
        "Run the whole suite and tell me what fails.",
        "Refactor src/dates.py so that parse_iso and parse_loose share one tokenizer.",
        "Check pyproject.toml: pin python >= 3.11 as we agreed.",
        "Summarize what changed so far and what is left to do.",
        "Add type hints to src/dates.py; I prefer them on public functions only.",
        "Make the error message for invalid dates name the offending field.",
        "Run the suite once more and commit with the message 'dates: strict parsing'.",
        "TODO: open an issue about timezone names once this lands.",
    ]
    for n, task in enumerate(tasks):
        call_id = f"call_{n:04d}"
        turns.append(
            [
                {"role": "user", "content": task},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "arguments": orjson.dumps(
                                    {
                                        "command": f"cat src/dates.py && python -m pytest tests/test_dates.py -k case_{n}"
                                    }
                                ).decode(),
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": source + "\n" + log},
                {
                    "role": "assistant",
                    "content": f"Step {n + 1} done: ran the tests, all 40 cases pass.",
                },
            ]
        )
    return turns


LEGEND = """\
The agent makes two requests per turn: one after the user's message (the model answers with a
tool call) and one after the tool's result. It sends its whole history every time. Per request:
  msgs            messages the agent sent
  tokens A -> B   estimated prompt tokens as the agent sent them -> as forwarded upstream
  none            forwarded unchanged (below the trigger, 85% of the window)
  applied         a compaction new to this conversation went out with this request
  reused          the same compaction as before went out again (no model call, same prefix)
  ↳ compaction    a compaction the proxy recorded. "precompute": prepared in the background once
                  the conversation passed 70% of the window, used when a request reaches 85%;
                  "extends": it updates the previous summary with the newly folded turns.
"""

MEMORY_LINES_SHOWN = 8


async def run_demo(out: TextIO = sys.stdout, workdir: Path = Path("workspace/demo")) -> int:
    """Run the demo; memory files are written under `workdir/memory` (emptied first)."""

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    memory_dir = (workdir / "memory").resolve()
    shutil.rmtree(memory_dir, ignore_errors=True)  # each run starts from an empty memory
    upstream_app = web.Application()
    upstream_app.router.add_post("/v1/chat/completions", _fake_upstream)
    upstream_runner, upstream_url = await serve_on_loopback(upstream_app)
    settings = Settings.model_validate(
        {
            "upstream": {"base_url": f"{upstream_url}/v1", "timeout_s": 30},
            "models": {"default_context_window": WINDOW},
            "compaction": {
                "keep_recent_rounds": 2,
                "summary_max_tokens": 400,
                "precompute_ratio": 0.7,
            },
            "memory": {"dir": str(memory_dir)},
            "admin": {"token": "demo-admin", "preview_chars": 4000},
            # Each run starts from nothing: no checkpoint of an earlier run is reused.
            "state": {"backend": "memory"},
        }
    )
    proxy_runner, proxy_url = await serve_on_loopback(create_app(settings))
    say(f"fake upstream {upstream_url}  ·  proxy {proxy_url}  ·  window {WINDOW} tokens")
    say(f"memory files go to {memory_dir}\n")
    say(LEGEND)
    messages: list[Message] = [
        {"role": "system", "content": "You are a careful coding agent. Use the bash tool."},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a shell command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    url = f"{proxy_url}/s/demo-agent/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as client:
            turns = _script()
            seen: dict[str, str] = {}
            for n, turn in enumerate(turns, 1):
                # Request after the user's message (tool call follows), then after the result.
                for sent in (turn[:1], turn[1:3]):
                    messages.extend(sent)
                    await _request(client, url, messages, tools, n, len(turns), say, seen)
                messages.append(turn[3])
    finally:
        await proxy_runner.cleanup()
        await upstream_runner.cleanup()
        _show_memory(memory_dir, say)
    return 0


async def _request(
    client: aiohttp.ClientSession,
    url: str,
    messages: list[Message],
    tools: object,
    turn: int,
    turns: int,
    say: Callable[[str], None],
    seen: dict[str, str],
) -> None:
    body = {"model": "demo-model", "messages": messages, "tools": tools}
    async with client.post(
        url, json=body, headers={"Authorization": "Bearer demo-key"}
    ) as response:
        await response.read()
        status = response.headers.get(STATUS, "?")
        before = response.headers.get(TOKENS_BEFORE)
        after = response.headers.get(TOKENS_AFTER)
    bar = "#" * turn + "." * (turns - turn)
    sizes = f"tokens {before:>5} -> {after:>5}" if before else "small body, not parsed"
    say(f"[{bar}] turn {turn:2d}/{turns}  {len(messages):3d} msgs  {sizes:<24} {status}")
    await _show_new_compactions(client, url, say, seen)


async def _show_new_compactions(
    client: aiohttp.ClientSession, url: str, say: Callable[[str], None], seen: dict[str, str]
) -> None:
    """Print the compaction records that appeared since the last request (precomputes included),
    each with what its summary says that the one it extends did not. `seen`: id -> summary."""
    await asyncio.sleep(0.05)  # a precompute started after the last request may land meanwhile
    admin = url.split("/s/")[0] + "/admin/sessions/demo-agent"
    async with client.get(admin, headers={"Authorization": "Bearer demo-admin"}) as response:
        if response.status != 200:
            return
        records = (await response.json())["records"]
    for record in records:
        if record["id"] in seen:
            continue
        seen[record["id"]] = record["summary_preview"]
        extends = f", extends {record['extends'][:8]}" if record["extends"] else ""
        say(
            f"    ↳ compaction {record['id'][:8]} ({record['reason']}, {record['path']}{extends}): "
            f"{record['tokens_before']} -> {record['tokens_after']} tokens, "
            f"{record['folded_messages']} messages folded, {record['memory_items']} memory items, "
            f"quality {record['quality']}"
        )
        before = {line.strip() for line in seen.get(record["extends"] or "", "").splitlines()}
        lines = dict.fromkeys(line.strip() for line in record["summary_preview"].splitlines())
        added = [line for line in lines if line.startswith("- ") and line not in before]
        label = "summary adds:" if record["extends"] else "summary:"
        for n, line in enumerate(added[:6]):
            say(f"      {label if n == 0 else ' ' * len(label)} {line[:110]}")
        if len(added) > 6:
            say(f"      {' ' * len(label)} … and {len(added) - 6} more lines")


def _show_memory(memory_dir: Path, say: Callable[[str], None]) -> None:
    files = sorted(memory_dir.glob("*/compaction_flush.jsonl"))
    say("")
    for file in files:
        lines = file.read_text(encoding="utf-8").splitlines()
        shown = f" (showing {MEMORY_LINES_SHOWN})" if len(lines) > MEMORY_LINES_SHOWN else ""
        say(f"memory file {file.relative_to(memory_dir)}: {len(lines)} items{shown}")
        for line in lines[:MEMORY_LINES_SHOWN]:
            item = orjson.loads(line)
            say(f"    {item['type']:<10} {item['content'][:90]}")
    if not files:
        say("no memory file was written")
    say(f"\nsummaries are marked with: {SUMMARY_MARKER}")
    say(f"memory files kept in {memory_dir}")


def main() -> int:
    return asyncio.run(run_demo())
