"""Fixtures for compaction through the real proxy: a scripted upstream, a proxy with a small
window, and conversations of a chosen size."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.admin.records import SessionRecords
from proxy.compacting.hook import Replacements, Shared, build_hook
from proxy.compacting.models.calibration import Calibration
from proxy.compacting.models.overflow import LearnedWindows
from proxy.http.upstream import Upstream
from proxy.metrics import Metrics
from proxy.state.local import LocalStore
from proxy.tasks import BackgroundTasks
from tests import factories as f
from tests.fakes.script import Script, tokens
from tests.fakes.upstream import FakeUpstream
from tests.proxy.conftest import RunningProxy, StartProxy, build_settings

WINDOW = 4000


@pytest.fixture
def script(upstream: FakeUpstream) -> Script:
    return Script(upstream)


@pytest.fixture
def start(start_proxy: StartProxy, tmp_path: Path) -> Callable[..., Awaitable[RunningProxy]]:
    """A proxy with a small window, memory under tmp_path, and an admin token; `parts` go to
    create_app (`store=`, `llm_for=`), `sections` override settings. What compaction forwards is
    tested as without recall (`recall: off` is that, byte for byte); the recall tool's additions
    are tested in tests/proxy/recall/."""
    return small_window_proxies(start_proxy, tmp_path, recall="off")


def small_window_proxies(
    start_proxy: StartProxy, tmp_path: Path, *, recall: str
) -> Callable[..., Awaitable[RunningProxy]]:
    async def run(parts: dict[str, Any] | None = None, **sections: Any) -> RunningProxy:
        settings: dict[str, dict[str, Any]] = {
            "models": {"default_context_window": WINDOW},
            "compaction": {
                "keep_recent_rounds": 2,
                "summary_max_tokens": 300,
                "precompute_ratio": 0,
                "recall": recall,
            },
            "memory": {"dir": str(tmp_path / "memory")},
            "admin": {"token": "admin-secret"},
        }
        for section, values in sections.items():
            settings.setdefault(section, {}).update(values)
        return await start_proxy(**(parts or {}), **settings)

    return run


def conversation_of(
    target_tokens: int, *, grow: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """A coding-agent history of roughly `target_tokens` ending in a user message; with `grow`,
    that history (its last message dropped) continued."""
    messages: list[dict[str, Any]] = grow[:-1] if grow else [f.system()]
    i = len(messages)
    # Counted a round at a time (a request's count is its messages' sum): counting the whole
    # list each round took 19 s for a megabyte body.
    total = tokens(messages)
    while total < target_tokens:
        added = f.tool_round(i, blocks=1, output_chars=300)
        messages += added
        total += tokens(added) - tokens([])
        i += 1
    messages.append(f.user(f"Now summarize round {i} for me."))
    return messages


async def post(
    client: aiohttp.ClientSession,
    proxy: RunningProxy,
    messages: list[Any],
    *,
    session: str = "agent-1",
    auth: str = "Bearer sk-client",
    **fields: Any,
) -> aiohttp.ClientResponse:
    body = orjson.dumps({"model": "gpt-test", "messages": messages, **fields})
    headers = {"Content-Type": "application/json", "Authorization": auth, "X-Session-Id": session}
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers=headers
    ) as response:
        await response.read()
        return response


def forwarded(script: Script) -> list[dict[str, Any]]:
    return [r.json() for r in script.calls(None)]


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


@contextlib.asynccontextmanager
async def with_hook(
    start_proxy: StartProxy, upstream: FakeUpstream, sections: dict[str, Any], **parts: Any
) -> AsyncIterator[RunningProxy]:
    """A proxy whose compacting hook is built with `parts`: the records it keeps and the
    offload it shares, or what it may replace (a compactor, body indexes, its state)."""
    settings = build_settings(upstream, **sections)
    metrics = Metrics()
    parts.setdefault("store", LocalStore(100, 600))
    records = parts.pop("records", SessionRecords(max_sessions=10, records_per_session=10))
    offload = parts.pop("offload", None)
    async with Upstream(settings.upstream, metrics) as own_upstream:
        shared = Shared(
            upstream=own_upstream,
            records=records,
            metrics=metrics.compaction,
            tasks=BackgroundTasks(),
            calibration=Calibration(),
            learned=LearnedWindows(),
            offload=offload,
        )
        hook = build_hook(settings, shared, Replacements(**parts))
        yield await start_proxy(hook=hook, **sections)
