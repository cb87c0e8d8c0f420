"""The end-to-end setting: scripted fakes of the three APIs, the real proxy in front of them
(small windows, so a few tool turns reach the trigger), and the real clients installed by
`make e2e` (tests/e2e/install.sh) under `.e2e/`.

The suite runs only through `make e2e` (pyproject's pytest options leave tests/e2e out of `make
test`). When npm could not install a client, its tests say so and are skipped: the install
script wrote why to `.e2e/unavailable`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.settings import Settings
from tests.e2e.apis import ScriptedApis

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / ".e2e"
ADMIN_TOKEN = "e2e-admin"
SDK_MODEL = "sdk-e2e"
# Codex's fixed head is about 10k tokens, Claude Code's 12k with its max_tokens of 32k on top:
# each window leaves room for a few growth steps past it.
WINDOWS = {"gpt-e2e": 40000, "claude-e2e": 60000, SDK_MODEL: 20000}


def client_binary(name: str) -> Path:
    """The installed client `name` (codex, claude); the test is skipped, saying why, when npm
    could not install it."""
    binary = CLIENTS / "node_modules" / ".bin" / name
    if not binary.exists():
        why = CLIENTS / "unavailable"
        reason = why.read_text().strip() if why.exists() else "run `make e2e` to install it"
        pytest.skip(f"SKIPPED {name}: not installed ({reason})")
    return binary


def agents_sdk() -> Any:
    """The openai-agents SDK (`agents`); the test is skipped, saying why, when pip could not
    install it."""
    try:
        import agents
    except ImportError:
        why = CLIENTS / "unavailable-agents"
        reason = why.read_text().strip() if why.exists() else "run `make e2e` to install it"
        pytest.skip(f"SKIPPED openai-agents: not installed ({reason})")
    return agents


@dataclass
class Stack:
    apis: ScriptedApis
    proxy_url: str
    http: aiohttp.ClientSession

    async def sessions(self) -> dict[str, int]:
        """Every session the proxy knows, with its request count."""
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with self.http.get(f"{self.proxy_url}/admin/sessions", headers=headers) as response:
            listed = await response.json()
        return {s["session_id"]: s["requests"] for s in listed["sessions"]}

    async def records(self, session: str) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        url = f"{self.proxy_url}/admin/sessions/{session}"
        async with self.http.get(url, headers=headers) as response:
            found = await response.json()
        records: list[dict[str, Any]] = found["records"]
        return records


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    apis = ScriptedApis(turns=12, lines=600)
    await apis.start()
    settings = Settings.build(
        {
            "upstream": {"base_url": f"{apis.url}/v1", "anthropic_base_url": f"{apis.url}/v1"},
            "models": {"context_windows": WINDOWS},
            "memory": {"dir": str(tmp_path / "memory")},
            "state": {"backend": "memory"},
            "admin": {"token": ADMIN_TOKEN},
        }
    )
    runner: web.AppRunner | None = None
    try:
        runner, url = await serve_on_loopback(create_app(settings))
        async with aiohttp.ClientSession() as http:
            yield Stack(apis, url, http)
    finally:
        if runner is not None:
            await runner.cleanup()
        await apis.close()
