"""Real processes for the state tests: `python -m proxy` started as a subprocess against the
test's fake upstream, and a real `redis-server` on a free loopback port (`make test` installs the
Debian package when it is missing)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import WINDOW

REPO = Path(__file__).resolve().parents[3]
_START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ProxyProcess:
    """`python -m proxy --config <file>` on a free loopback port; stderr (JSON log lines) goes to
    a file the test can read."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None, "the proxy was never started"
        return self._process.pid

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "proxy",
                "--config",
                str(self.config),
                "--port",
                str(self.port),
                cwd=str(self.config.parent),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )
        async with aiohttp.ClientSession() as client:
            for _ in range(int(_START_TIMEOUT_S / 0.05)):
                if self._process.returncode is not None:
                    raise AssertionError(f"proxy exited at start:\n{self.log.read_text()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with client.get(f"{self.url}/healthz") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.05)
        raise AssertionError(f"proxy did not start:\n{self.log.read_text()}")

    async def stop(self, how: signal.Signals = signal.SIGTERM) -> int:
        process = self._process
        if process is None or process.returncode is not None:
            return process.returncode if process is not None else 0
        process.send_signal(how)
        try:
            return await asyncio.wait_for(process.wait(), 20)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    async def metric(self, client: aiohttp.ClientSession, name: str) -> float:
        """The sum of every sample of `name` on /metrics (0 when absent)."""
        async with client.get(f"{self.url}/metrics") as response:
            text = await response.text()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name)] in " {":
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture
def script(upstream: FakeUpstream) -> Script:
    return Script(upstream)


SpawnProxy = Callable[..., Awaitable[ProxyProcess]]


@pytest.fixture
async def spawn(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[SpawnProxy]:
    """`await spawn(name, **sections)`: a proxy process with the compaction tests' small window,
    memory and state under tmp_path, `sections` overriding the config."""
    started: list[ProxyProcess] = []

    async def run(name: str = "proxy", **sections: dict[str, Any]) -> ProxyProcess:
        config: dict[str, dict[str, Any]] = {
            "upstream": {"base_url": upstream.base_url},
            # The scripted fake answers a model listing too: the window is the one typed here.
            "models": {"default_context_window": WINDOW, "discover": False},
            "compaction": {
                "keep_recent_rounds": 2,
                "summary_max_tokens": 300,
                "precompute_ratio": 0,
            },
            "memory": {"dir": str(tmp_path / "memory")},
            "state": {"backend": "sqlite", "path": str(tmp_path / "state.sqlite3")},
            "logging": {"level": "INFO"},
        }
        for section, values in sections.items():
            config.setdefault(section, {}).update(values)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        process = ProxyProcess(path, tmp_path / f"{name}.log")
        started.append(process)
        await process.start()
        return process

    yield run
    for process in started:
        await process.stop(signal.SIGKILL)


class RedisServer:
    """A real redis-server on a loopback port, without persistence; stop and start it again on
    the same port to play an outage."""

    def __init__(self, binary: str, port: int, *options: str) -> None:
        self.binary = binary
        self.port = port
        self.options = options
        self.url = f"redis://127.0.0.1:{port}/0"
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "yes",
            *self.options,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(200):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            await asyncio.sleep(0.025)
        raise AssertionError(f"redis-server did not listen on {self.port}")

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        self._process = None


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not on PATH: `make test` installs the Debian package redis-server"
            " (as root); otherwise install it (apt-get install redis-server, brew install redis)"
        )
    return binary


@pytest.fixture
async def redis_server() -> AsyncIterator[RedisServer]:
    server = RedisServer(redis_binary(), free_port())
    await server.start()
    yield server
    await server.stop()
