"""Decompression bombs: a small encoded request body that decodes to 2 GiB is refused at
`server.max_body_mb` of decoded bytes, the connection closed instead of drained, while
`/healthz` keeps answering and the process's memory stays within a bound (its peak, VmHWM,
reset before each bomb). How fast `/healthz` answers meanwhile is bench.bombs's figure."""

from __future__ import annotations

import asyncio
import functools
import io

import aiohttp
import pytest

from bench.bombs import bomb
from tests.proxy.conftest import StartProxy
from tests.proxy.http.test_errors import assert_openai_error

DECODED = 2 << 30  # 2 GiB
RSS_BOUND_KB = 128 * 1024


@functools.cache
def _bomb(encoding: str) -> bytes:
    return bomb(encoding, DECODED)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """VmHWM starts again from the current RSS (proc(5), /proc/pid/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


async def _ask_healthz(url: str, stop: asyncio.Event) -> list[int]:
    """`/healthz` asked back to back, each on a new connection, until `stop`: the statuses."""
    statuses: list[int] = []
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=30)
    ) as session:
        while not stop.is_set():
            async with session.get(f"{url}/healthz") as response:
                statuses.append(response.status)
            await asyncio.sleep(0.02)
    return statuses


@pytest.mark.parametrize("encoding", ["br", "gzip", "zstd"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/s/a/v1/responses"])
async def test_a_small_body_that_decodes_to_gigabytes_is_a_413_and_nobody_waits_on_it(
    start_proxy: StartProxy, client: aiohttp.ClientSession, encoding: str, path: str
) -> None:
    body = _bomb(encoding)
    proxy = await start_proxy()  # server.max_body_mb: 64, the default
    stop = asyncio.Event()
    asking = asyncio.create_task(_ask_healthz(proxy.url, stop))
    await asyncio.sleep(0.05)
    before_kb = _status_kb("VmRSS")
    _reset_peak()
    async with client.post(
        f"{proxy.url}{path}",
        data=io.BytesIO(body),  # gzip's is 2 MB: aiohttp warns of sending that from bytes
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    ) as response:
        assert response.status == 413
        # Closed, not drained: draining would decode the rest of the 2 GiB.
        assert response.headers["Connection"] == "close"
        assert_openai_error(await response.read(), "request_too_large")
    await asyncio.sleep(0.5)  # when aiohttp would have drained the rest
    stop.set()
    statuses = await asyncio.wait_for(asking, 30)
    rise_kb = _status_kb("VmHWM") - before_kb
    assert statuses and set(statuses) == {200}
    assert rise_kb < RSS_BOUND_KB, f"RSS rose {rise_kb // 1024} MB"


@pytest.mark.parametrize("encoding", ["br", "gzip", "zstd"])
@pytest.mark.parametrize(
    "path", ["/healthz", "/metrics", "/admin/sessions", "/admin/api/live", "/admin/"]
)
async def test_a_route_that_takes_no_body_refuses_an_encoded_one_at_once(
    start_proxy: StartProxy, client: aiohttp.ClientSession, encoding: str, path: str
) -> None:
    proxy = await start_proxy(admin={"token": "t" * 32})
    before_kb = _status_kb("VmRSS")
    _reset_peak()
    async with client.get(
        f"{proxy.url}{path}",
        data=io.BytesIO(_bomb(encoding)),
        headers={"Content-Encoding": encoding, "Authorization": "Bearer " + "t" * 32},
    ) as response:
        assert response.status == 415
        assert response.headers["Connection"] == "close"
        assert_openai_error(await response.read(), "unsupported_content_encoding")
    assert _status_kb("VmHWM") - before_kb < RSS_BOUND_KB


async def test_a_coding_named_without_a_body_is_no_reason_to_refuse(
    start_proxy: StartProxy, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy()
    async with client.get(f"{proxy.url}/healthz", headers={"Content-Encoding": "gzip"}) as r:
        assert r.status == 200
