"""Growing conversations of each API driven through the real proxy
(tests/proxy/compacting/fast/test_path.py): what the upstream received, what the agent was told,
and how many requests were answered from what is remembered."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.dialects import WIRES
from proxy.compacting.fast.spans import locate_value, scan_items
from proxy.http import keys
from tests import factories as f
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import wait_for

# Bodies must pass the 64 KiB below which nothing is remembered: a window of 24k tokens is about
# 96 KB of history in each dialect.
WINDOW = 24_000
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
DIALECTS = ["chat", "responses", "anthropic"]
RECOGNIZED = "compaction_proxy_recognized_requests_total"


def history(dialect: str, share: float) -> list[dict[str, Any]]:
    """A coding-agent history of about `share` of the window in `dialect`, ending in a request."""
    messages = [f.system()]
    i = 0
    while tokens(dialect, [*messages, f.user("Go on.")]) < share * WINDOW:
        messages += f.tool_round(i, blocks=2, output_chars=900)
        i += 1
    return [*messages, f.user(f"Now do task {i}.")]


def grown(messages: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The agent's next request: a tool call answered, a reply, a new request (about 5% of the
    window in every dialect)."""
    output = f"output {step} " * 280
    return [
        *messages,
        *f.tool_block(1, output=output),
        f.assistant(f"Step {step} done."),
        f.user(f"Next step {step}?"),
    ]


def conversation(dialect: str, steps: int) -> list[list[dict[str, Any]]]:
    """The histories of `steps` requests of one conversation, starting at 0.8 of the window
    (built once: both passes must send the same call ids)."""
    requests = [history(dialect, 0.8)]
    for step in range(steps - 1):
        requests.append(grown(requests[-1], step))
    return requests


def tokens(dialect: str, messages: list[dict[str, Any]]) -> int:
    wire = WIRES[dialect]
    return wire.tokens(wire.body(messages, TOOLS))


def body_of(
    dialect: str,
    messages: list[dict[str, Any]],
    system: str = "",
    *,
    spaced: bool = False,
    marked: bool = False,
) -> bytes:
    """The request as that API's client sends it: Responses items without `role` (reasoning
    with encrypted_content, function_call, function_call_output); Anthropic thinking blocks with
    signatures, tool_use / tool_result, and a `system` with cache_control written after the list
    (so the bytes of the known prefix do not cover it). `spaced`: written by Python's json
    (", " and ": "), not as orjson writes it. `marked` (Anthropic): a cache_control breakpoint on
    the last block of the last two user turns, as Anthropic's documentation has multi-turn
    clients do, so an earlier turn loses its mark from one request to the next."""
    payload = WIRES[dialect].body(messages, TOOLS)
    if dialect == "responses":
        payload.update(store=False, include=["reasoning.encrypted_content"])
    if dialect == "anthropic":
        head = payload.pop("system")
        head[0]["text"] += system
        payload.update(system=head, thinking={"type": "enabled", "budget_tokens": 1024})
        if marked:
            users = [turn for turn in payload["messages"] if turn["role"] == "user"][-2:]
            for turn in users:
                if isinstance(turn["content"], list):
                    turn["content"][-1] = {
                        **turn["content"][-1],
                        "cache_control": {"type": "ephemeral"},
                    }
    return json.dumps(payload).encode() if spaced else orjson.dumps(payload)


def headers_of(dialect: str, session: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-client"}
    if dialect == "anthropic":
        headers.update({"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"})
    if session is not None:
        headers["X-Session-Id"] = session
    return headers


@dataclass
class Run:
    """What one pass of a conversation through a proxy produced."""

    outcomes: list[tuple[str, ...]]
    forwarded: list[bytes]
    summaries: int
    memory: list[tuple[str, str]]
    decided_known: list[float]
    """Per request, how many requests so far were decided from what is remembered."""
    reasons: dict[str, str]
    """Why each checkpoint (by its order of appearance) was made: trigger, precompute."""


async def drive(
    start: Any,
    script: Script,
    client: Any,
    upstream: FakeUpstream,
    memory_dir: Path,
    dialect: str,
    requests: list[list[dict[str, Any]]],
    *,
    known_mb: float = 64,
    session: str | None = None,
    precompute_ratio: float = 0,
    system_change_at: int | None = None,
    spaced: bool = False,
    marked: bool = False,
) -> Run:
    script.upstream.requests.clear()
    proxy = await start(
        upstream={"anthropic_base_url": upstream.base_url},
        models={"default_context_window": WINDOW},
        compaction={"known_requests_mb": known_mb, "precompute_ratio": precompute_ratio},
        memory={"dir": str(memory_dir)},
    )
    path = {"chat": "chat/completions", "responses": "responses", "anthropic": "messages"}
    url = f"{proxy.url}/v1/{path[dialect]}"
    ids: dict[str, str] = {}
    run = Run([], [], 0, [], [], {})
    idle = len(proxy.app[keys.TASKS])  # the proxy's own watchers
    for step, messages in enumerate(requests):
        system = " Be brief." if system_change_at is not None and step >= system_change_at else ""
        body = body_of(dialect, messages, system, spaced=spaced, marked=marked)
        async with client.post(url, data=body, headers=headers_of(dialect, session)) as response:
            await response.read()
            assert response.status == 200
            got = response.headers
        # The same checkpoint in both passes: ids are random, their order of appearance is not.
        cid = ids.setdefault(got.get("x-compaction-id", "-"), f"#{len(ids)}")
        run.outcomes.append(
            (
                got["x-compaction-status"],
                got["x-compaction-tokens-before"],
                got["x-compaction-tokens-after"],
                got["x-compaction-session"],
                cid,
            )
        )
        await wait_for(lambda: len(proxy.app[keys.TASKS]) == idle)  # precomputes done
        run.decided_known.append(await metric(client, proxy.url, RECOGNIZED, decision="known"))
    records = proxy.app[keys.RECORDS]
    for session_id in {outcome[3] for outcome in run.outcomes}:
        for record in (records.get(session_id) or {"records": []})["records"]:
            if record["id"] in ids:
                run.reasons[ids[record["id"]]] = record["reason"]
    run.forwarded = [r.body for r in script.calls(None)]
    run.summaries = len(script.calls("summary"))
    run.memory = [
        (item["type"], item["content"])
        for file in sorted(memory_dir.glob("*/compaction_flush.jsonl"))
        for item in map(orjson.loads, file.read_text().splitlines())
    ]
    assert script.problems == []
    return run


async def metric(client: Any, url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples on /metrics whose labels include `labels`."""
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in text.splitlines():
        if line.startswith(name) and all(label in line for label in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def list_end(body: bytes, dialect: str) -> int:
    """Where the forwarded list of `body` closes."""
    open_at = locate_value(body, b'"input"' if dialect == "responses" else b'"messages"')
    items = scan_items(body, open_at) if open_at is not None else None
    assert items is not None
    return items.close
