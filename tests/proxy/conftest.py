"""Fixtures for end-to-end proxy tests: a FakeUpstream, and the real app on a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from compaction.checkpoints import CheckpointStore
from proxy.app import create_app
from proxy.compacting.models.llm_client import LLMFactory
from proxy.http.serving import serve_on_loopback
from proxy.interception import Hook
from proxy.settings import Settings
from proxy.state.archive import Archive
from tests.fakes.upstream import FakeUpstream


class RunningProxy:
    """The proxy app served on 127.0.0.1 the way the CLI serves it (handler cancellation on)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.port = 0

    async def start(self) -> None:
        self._runner, self.url = await serve_on_loopback(self.app)
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def build_settings(fake: FakeUpstream, **sections: dict[str, Any]) -> Settings:
    # State in the process unless a test names a backend: no test shares a state file. The
    # scripted fake answers whatever it is sent, a model listing included, so a test's window is
    # the one it types unless it turns `models.discover` on (tests/proxy/compacting/test_discovery).
    # A request at the trigger compacts before it goes (`fit_ratio` None), so a test reads the
    # compaction in the response to the request that crossed it; the room between the trigger
    # and the fit limit is tested where a test names `fit_ratio` (test_two_moments.py).
    data: dict[str, Any] = {
        "upstream": {"base_url": fake.base_url},
        "state": {"backend": "memory"},
        "models": {"discover": False},
        "compaction": {"fit_ratio": None},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return Settings.build(data)


StartProxy = Callable[..., Awaitable[RunningProxy]]


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as fake:
        yield fake


@pytest.fixture
async def start_proxy(upstream: FakeUpstream) -> AsyncIterator[StartProxy]:
    """`await start_proxy(hook=None, store=None, llm_for=None, archive_backend=None,
    **sections)`: a running proxy pointed at `upstream`,
    sections overriding settings (e.g. `upstream={"timeout_s": 0.2}`)."""
    async with AsyncExitStack() as stack:

        async def start(
            hook: Hook | None = None,
            *,
            store: CheckpointStore | None = None,
            llm_for: LLMFactory | None = None,
            archive_backend: Archive | None = None,
            **sections: Any,
        ) -> RunningProxy:
            settings = build_settings(upstream, **sections)
            app = create_app(
                settings, hook=hook, store=store, llm_for=llm_for, archive=archive_backend
            )
            running = RunningProxy(app)
            await running.start()
            stack.push_async_callback(running.close)
            return running

        yield start


@pytest.fixture
async def proxy(start_proxy: StartProxy) -> RunningProxy:
    return await start_proxy()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client that leaves bodies and headers alone (no decompression)."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session
