"""The middleware (proxy.http.middleware): every answer counted and logged with the status the
client saw, 404s, 405s and aiohttp's own errors in the API's shape, a client that went away as
499."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson
import pytest

from proxy.logs import JsonFormatter
from tests.fakes.rawhttp import raw_request
from tests.fakes.upstream import FakeUpstream, hang_reply
from tests.proxy.conftest import RunningProxy


async def _requests_total(client: aiohttp.ClientSession, url: str) -> list[str]:
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    return [line for line in text.splitlines() if line.startswith("compaction_proxy_requests")]


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    formatter = JsonFormatter()
    rendered = [formatter.format(record) for record in caplog.records]
    return [orjson.loads(line) for line in rendered if '"logger":"proxy.access"' in line]


async def test_aiohttp_errors_are_shaped_counted_and_logged_with_their_status(
    proxy: RunningProxy, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with client.post(f"{proxy.url}/healthz") as response:
        assert response.status == 405
        assert "GET" in response.headers["Allow"]
        error = (await response.json())["error"]
        assert error["type"] == "invalid_request_error"
    async with client.get(f"{proxy.url}/nowhere") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "not_found"
    async with client.head(f"{proxy.url}/healthz") as response:
        assert response.status == 200
    lines = await _requests_total(client, proxy.url)
    # The 405 is counted under the route that refused the method.
    assert 'compaction_proxy_requests_total{method="POST",route="healthz",status="405"} 1.0' in (
        lines
    )
    assert 'compaction_proxy_requests_total{method="GET",route="unmatched",status="404"} 1.0' in (
        lines
    )
    statuses = [(line["path"], line["status"]) for line in _access_lines(caplog)]
    assert ("/healthz", 405) in statuses and ("/nowhere", 404) in statuses


async def test_a_target_that_is_not_a_path_is_a_shaped_and_counted_404(
    proxy: RunningProxy, client: aiohttp.ClientSession
) -> None:
    # No route pattern matches a target without a leading slash (`OPTIONS *`, a server-wide
    # probe): the answer must still be ours, not aiohttp's text 404, and counted.
    status, payload = await raw_request(proxy.port, "OPTIONS", "*")
    assert status == 404
    assert orjson.loads(payload)["error"]["code"] == "not_found"
    lines = await _requests_total(client, proxy.url)
    assert (
        'compaction_proxy_requests_total{method="OPTIONS",route="unmatched",status="404"} 1.0'
        in (lines)
    )


async def test_a_client_that_goes_away_is_counted_and_logged_as_499(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    upstream.reply(hang_reply())
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(asyncio.TimeoutError):
        async with client.post(
            f"{proxy.url}/v1/chat/completions",
            data=body,
            timeout=aiohttp.ClientTimeout(total=0.5),
        ):
            pass
    for _ in range(100):  # the proxy learns of the closed connection a moment later
        lines = await _requests_total(client, proxy.url)
        if any('status="499"' in line for line in lines):
            break
        await asyncio.sleep(0.02)
    assert 'compaction_proxy_requests_total{method="POST",route="chat",status="499"} 1.0' in lines
    async with client.get(f"{proxy.url}/metrics") as response:
        assert "compaction_proxy_in_flight_requests 1.0" in await response.text()  # this one
    gone = [line for line in _access_lines(caplog) if line["status"] == 499]
    assert len(gone) == 1 and gone[0]["outcome"] == "client_gone"


@pytest.mark.parametrize(
    ("path", "route", "api"),
    [
        ("/v1/chat/completions", "chat", "openai"),
        ("/s/agent/v1/messages", "messages", "anthropic"),
        ("/v1/messages/count_tokens", "forward", "anthropic"),
        ("/v1/files", "forward", "openai"),
        ("/healthz", "healthz", "openai"),
        ("/elsewhere", "unmatched", "openai"),
    ],
)
async def test_an_unknown_expectation_is_a_shaped_counted_and_logged_417(
    path: str,
    route: str,
    api: str,
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    headers = {"Expect": "something-else", "Content-Type": "application/json"}
    status, payload = await raw_request(proxy.port, "POST", path, headers, body=b"{}")
    assert status == 417
    error = orjson.loads(payload)["error"]
    if api == "anthropic":
        assert orjson.loads(payload)["type"] == "error"
        assert set(error) == {"type", "message"}
    else:
        assert error["code"] == "expectation_failed"
    assert "something-else" in error["message"]
    lines = await _requests_total(client, proxy.url)
    counted = f'compaction_proxy_requests_total{{method="POST",route="{route}",status="417"}} 1.0'
    assert counted in lines
    assert [(line["path"], line["status"]) for line in _access_lines(caplog)][:1] == [(path, 417)]
    assert upstream.requests == []
