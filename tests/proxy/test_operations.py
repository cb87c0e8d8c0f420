"""Operations: health, metrics, admin endpoints, and logs that keep secrets out."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson
import pytest

from proxy.interception import Exchange, Passthrough, RequestContext
from proxy.logs import JsonFormatter
from tests.fakes.rawhttp import raw_request
from tests.fakes.upstream import FakeUpstream, hang_reply, json_reply
from tests.proxy.conftest import RunningProxy, StartProxy

SECRET_KEY = "sk-live-DO-NOT-LOG-1234567890"
SECRET_CONTENT = "my password is hunter2"


async def test_healthz(proxy: RunningProxy, client: aiohttp.ClientSession) -> None:
    async with client.get(f"{proxy.url}/healthz") as response:
        assert response.status == 200
        assert await response.json() == {"status": "ok"}


async def test_metrics_expose_requests_latency_bytes_and_errors(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    body = b'{"model":"m","messages":[]}'
    async with client.post(f"{proxy.url}/v1/chat/completions", data=body) as response:
        relayed = await response.read()
    upstream.reply(json_reply({"error": {"message": "no"}}, status=429))
    async with client.get(f"{proxy.url}/v1/models"):
        pass
    async with client.get(f"{proxy.url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    lines = set(text.splitlines())
    assert 'compaction_proxy_requests_total{method="POST",route="chat",status="200"} 1.0' in lines
    assert 'compaction_proxy_requests_total{method="GET",route="forward",status="429"} 1.0' in lines
    assert 'compaction_proxy_upstream_latency_seconds_count{route="chat"} 1.0' in lines
    assert f'compaction_proxy_request_bytes_total{{route="chat"}} {float(len(body))}' in lines
    assert f'compaction_proxy_response_bytes_total{{route="chat"}} {float(len(relayed))}' in lines
    # /metrics itself is in flight while it renders
    assert "compaction_proxy_in_flight_requests 1.0" in lines


async def test_admin_endpoints_do_not_exist_without_a_token(
    proxy: RunningProxy, client: aiohttp.ClientSession
) -> None:
    # Whatever the method: a 405 (with its Allow: GET) would tell that they are there.
    for method in ("GET", "POST", "DELETE", "OPTIONS"):
        for path in ("/admin/sessions", "/admin/sessions/abc"):
            async with client.request(
                method, f"{proxy.url}{path}", headers={"Authorization": "Bearer anything"}
            ) as response:
                assert response.status == 404, (method, path)
                assert "Allow" not in response.headers
                assert (await response.json())["error"]["code"] == "not_found"


async def test_admin_endpoints_refuse_other_methods_when_enabled(
    start_proxy: StartProxy, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(admin={"token": "admin-secret"})
    async with client.delete(f"{proxy.url}/admin/sessions/abc") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "GET,HEAD"


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", "Bearer admin-secre", "Basic admin-secret", "admin-secret"],
)
async def test_admin_endpoints_refuse_a_wrong_token(
    start_proxy: StartProxy, client: aiohttp.ClientSession, authorization: str | None
) -> None:
    proxy = await start_proxy(admin={"token": "admin-secret"})
    headers = {"Authorization": authorization} if authorization else {}
    async with client.get(f"{proxy.url}/admin/sessions", headers=headers) as response:
        assert response.status == 401
        assert (await response.json())["error"]["type"] == "authentication_error"


async def test_an_admin_token_that_is_not_utf8_is_refused_and_not_logged(
    start_proxy: StartProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    proxy = await start_proxy(admin={"token": "admin-secret"})
    # "\udcff" goes out as the byte 0xff: a header aiohttp reads with surrogateescape.
    sent = {"Authorization": f"Bearer {SECRET_KEY}\udcff"}
    status, payload = await raw_request(proxy.port, "GET", "/admin/sessions", sent)
    assert status == 401
    assert orjson.loads(payload)["error"]["type"] == "authentication_error"
    assert not any(
        SECRET_KEY in record.getMessage() or record.exc_info for record in caplog.records
    )


async def test_admin_endpoints_list_sessions_with_the_right_token(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(admin={"token": "admin-secret"})
    auth = {"Authorization": "Bearer admin-secret"}
    for session in ("alpha", "beta", "alpha"):
        async with client.post(f"{proxy.url}/s/{session}/v1/chat/completions", data=b"{}"):
            pass
    async with client.get(f"{proxy.url}/admin/sessions", headers=auth) as response:
        assert response.status == 200
        listing = await response.json()
    assert [s["session_id"] for s in listing["sessions"]] == ["alpha", "beta"]
    async with client.get(f"{proxy.url}/admin/sessions/alpha", headers=auth) as response:
        one = await response.json()
    assert one["requests"] == 2 and one["records"] == []
    async with client.get(f"{proxy.url}/admin/sessions/nobody", headers=auth) as response:
        assert response.status == 404


async def test_logs_carry_one_line_per_request_and_no_credential_or_body(
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = await start_proxy(upstream={"api_key": SECRET_KEY})
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": SECRET_CONTENT}]})
    upstream.reply(json_reply({"echo": SECRET_CONTENT}))
    async with client.post(
        f"{proxy.url}/s/sess-9/v1/chat/completions?key=q",
        data=body,
        headers={"Authorization": f"Bearer {SECRET_KEY}x"},
    ):
        pass
    async with client.get(f"{proxy.url}/v1/models"):  # the injected key is used here
        pass
    assert upstream.requests[-1].headers["Authorization"] == f"Bearer {SECRET_KEY}"

    formatter = JsonFormatter()
    rendered = [formatter.format(record) for record in caplog.records]
    for line in rendered:
        assert SECRET_KEY not in line
        assert "hunter2" not in line
    access = [orjson.loads(line) for line in rendered if '"logger":"proxy.access"' in line]
    assert len(access) == 2
    first = access[0]
    assert first["method"] == "POST"
    assert first["path"] == "/s/sess-9/v1/chat/completions"
    assert first["status"] == 200 and first["upstream_status"] == 200
    assert first["session"] == "sess-9"
    assert first["duration_ms"] >= 0
    assert access[1]["session"] == "-"


async def test_upstream_failures_are_counted_by_kind(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(upstream={"timeout_s": 0.2})
    upstream.reply(hang_reply())
    for _ in range(2):
        async with client.post(f"{proxy.url}/v1/chat/completions", data=b"{}") as response:
            assert response.status == 504
    async with client.get(f"{proxy.url}/metrics") as response:
        lines = set((await response.text()).splitlines())
    assert 'compaction_proxy_upstream_errors_total{kind="timeout"} 2.0' in lines
    assert not any(
        line.startswith('compaction_proxy_upstream_errors_total{kind="connect"}') for line in lines
    )


class LoopBlockingHook:
    """A hook that does 0.3 s of work on the event loop: what the lag metric must show."""

    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        time.sleep(0.3)
        return Passthrough(body=body)


async def test_event_loop_lag_is_a_metric(
    start_proxy: StartProxy, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(hook=LoopBlockingHook())
    async with client.post(f"{proxy.url}/v1/chat/completions", data=b"{}") as response:
        assert response.status == 200
    await asyncio.sleep(0.1)  # the monitor's timer fires, late, after the blocking work
    async with client.get(f"{proxy.url}/metrics") as response:
        lines = set((await response.text()).splitlines())
    late = [
        line
        for line in lines
        if line.startswith('compaction_proxy_event_loop_lag_seconds_bucket{le="0.25"}')
    ]
    total = [
        line for line in lines if line.startswith("compaction_proxy_event_loop_lag_seconds_count")
    ]
    assert float(late[0].split()[-1]) < float(total[0].split()[-1])


async def test_metrics_carry_no_created_series(
    proxy: RunningProxy, client: aiohttp.ClientSession
) -> None:
    async with client.post(f"{proxy.url}/v1/chat/completions", data=b"{}"):
        pass
    async with client.get(f"{proxy.url}/metrics") as response:
        text = await response.text()
    assert "compaction_proxy_requests_total{" in text
    assert "_created" not in text
