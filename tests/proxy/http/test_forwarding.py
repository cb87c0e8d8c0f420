"""Forwarding is transparent: bytes, paths, query strings, headers and statuses pass unchanged."""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import orjson

from tests.fakes.upstream import FakeUpstream, chat_completion, json_reply, raw_reply
from tests.proxy.conftest import RunningProxy, StartProxy

# Deliberately odd formatting and unknown vendor fields: any re-serialisation would show.
CHAT_BODY = (
    b'{"model": "gpt-4o",  "messages":[{"role":"system","content":"be brief"},'
    b'{"role":"user","content":"caf\\u00e9 \xe2\x98\x95"}],'
    b'"x_vendor": {"priority": 7, "tags": ["a"]}, "temperature": 0.20, "stream": false}'
)


async def test_unchanged_chat_request_reaches_the_upstream_byte_for_byte(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=CHAT_BODY,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-client"},
    ) as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == chat_completion("hello")
    sent = upstream.requests[-1]
    assert sent.method == "POST"
    assert sent.path == "/v1/chat/completions"
    assert sent.body == CHAT_BODY
    assert sent.headers["Content-Length"] == str(len(CHAT_BODY))
    assert sent.headers["Content-Type"] == "application/json"


async def test_response_body_and_headers_reach_the_client_unchanged(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    body = b'{"weird" :  "spacing",\n "kept": true}'
    upstream.reply(raw_reply(body, headers={"x-request-id": "req-1", "openai-processing-ms": "5"}))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=b"{}") as response:
        assert await response.read() == body
        assert response.headers["x-request-id"] == "req-1"
        assert response.headers["openai-processing-ms"] == "5"
        assert float(response.headers["x-compaction-proxy-overhead-ms"]) >= 0


async def test_query_string_is_kept_as_sent(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    upstream.reply(json_reply({"ok": True}))
    url = f"{proxy.url}/v1/chat/completions?api-version=2024-06-01&x=a%20b&x=c"
    async with client.post(url, data=b"{}") as response:
        assert response.status == 200
    assert upstream.requests[-1].query_string == "api-version=2024-06-01&x=a%20b&x=c"


async def test_get_models_is_forwarded(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    models = {"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]}
    upstream.reply(json_reply(models))
    async with client.get(f"{proxy.url}/v1/models?limit=5") as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == models
    sent = upstream.requests[-1]
    assert (sent.method, sent.path, sent.query_string) == ("GET", "/v1/models", "limit=5")
    assert sent.body == b""


async def test_other_methods_and_paths_are_forwarded_with_their_bodies(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    upstream.reply(json_reply({"deleted": True}))
    async with client.delete(f"{proxy.url}/v1/files/file-abc") as response:
        assert response.status == 200
    assert (upstream.requests[-1].method, upstream.requests[-1].path) == (
        "DELETE",
        "/v1/files/file-abc",
    )
    # GET on the chat path is a different API (stored completions): forwarded, not refused.
    async with client.get(f"{proxy.url}/v1/chat/completions?limit=1") as response:
        assert response.status == 200
    assert upstream.requests[-1].method == "GET"
    big = bytes(range(256)) * 4096  # 1 MiB of binary, streamed through the generic route
    async with client.post(f"{proxy.url}/v1/files", data=big) as response:
        assert response.status == 200
    assert upstream.requests[-1].body == big


async def test_session_path_prefix_is_stripped_before_forwarding(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    async with client.post(f"{proxy.url}/s/agent-7/v1/chat/completions", data=CHAT_BODY) as r:
        assert r.status == 200
    assert upstream.requests[-1].path == "/v1/chat/completions"
    assert upstream.requests[-1].body == CHAT_BODY
    upstream.reply(json_reply({"data": []}))
    async with client.get(f"{proxy.url}/s/agent-7/v1/models") as r:
        assert r.status == 200
    assert upstream.requests[-1].path == "/v1/models"


async def test_hop_by_hop_headers_are_stripped_both_ways(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    upstream.reply(
        raw_reply(
            b"{}",
            headers={
                "Keep-Alive": "timeout=5",
                "X-Upstream-Secret-Hop": "1",
                "Connection": "X-Upstream-Secret-Hop",
                "x-end-to-end": "yes",
            },
        )
    )
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=b"{}",
        headers={
            "Connection": "keep-alive, X-Client-Hop",
            "X-Client-Hop": "secret",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic eA==",
            "TE": "trailers",
            "Upgrade": "h2c",
            "X-End-To-End": "kept",
        },
    ) as response:
        assert response.headers["x-end-to-end"] == "yes"
        assert "X-Upstream-Secret-Hop" not in response.headers
        assert response.headers.get("Keep-Alive") is None
    sent = upstream.requests[-1].headers
    for name in ("X-Client-Hop", "Keep-Alive", "Proxy-Authorization", "TE", "Upgrade"):
        assert name not in sent, name
    assert sent["X-End-To-End"] == "kept"
    assert sent["Host"] == f"127.0.0.1:{upstream.port}"


async def test_client_authorization_passes_through_and_api_key_fills_in_when_absent(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(upstream={"api_key": "sk-configured"})
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=b"{}", headers={"Authorization": "Bearer sk-own"}
    ):
        pass
    assert upstream.requests[-1].headers.getall("Authorization") == ["Bearer sk-own"]
    async with client.get(f"{proxy.url}/v1/models"):
        pass
    assert upstream.requests[-1].headers["Authorization"] == "Bearer sk-configured"


async def test_no_authorization_is_invented_without_an_api_key(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    async with client.post(f"{proxy.url}/v1/chat/completions", data=b"{}"):
        pass
    assert "Authorization" not in upstream.requests[-1].headers


async def test_upstream_errors_are_relayed_with_body_and_headers(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    cases = [
        (
            401,
            {
                "error": {
                    "message": "Incorrect API key",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
            {"www-authenticate": "Bearer"},
        ),
        (
            429,
            {"error": {"message": "Rate limit", "type": "requests", "code": "rate_limit"}},
            {"retry-after": "7", "x-ratelimit-remaining-requests": "0"},
        ),
        (
            500,
            {"error": {"message": "The server had an error", "type": "server_error"}},
            {"x-request-id": "req-500"},
        ),
    ]
    for status, payload, headers in cases:
        upstream.reply(json_reply(payload, status=status, headers=headers))
        async with client.post(f"{proxy.url}/v1/chat/completions", data=CHAT_BODY) as response:
            assert response.status == status
            assert orjson.loads(await response.read()) == payload
            for name, value in headers.items():
                assert response.headers[name] == value


async def test_invalid_json_chat_request_is_forwarded_and_the_upstream_400_relayed(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    error = {
        "error": {
            "message": "We could not parse the JSON body",
            "type": "invalid_request_error",
            "code": None,
        }
    }
    upstream.reply(json_reply(error, status=400))
    broken = b'{"model": "gpt-4o", "messages": [,,,'
    async with client.post(f"{proxy.url}/v1/chat/completions", data=broken) as response:
        assert response.status == 400
        assert orjson.loads(await response.read()) == error
    assert upstream.requests[-1].body == broken


async def test_compressed_bodies_pass_through_untouched_both_ways(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    payload = gzip.compress(orjson.dumps(chat_completion("zipped")))
    upstream.reply(raw_reply(payload, headers={"Content-Encoding": "gzip"}))
    request_body = gzip.compress(CHAT_BODY)
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=request_body,
        headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
    ) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert await response.read() == payload
    sent = upstream.requests[-1]
    # The request body is read (decoded by the proxy) and, unchanged, goes upstream as the
    # client sent it: its bytes and the coding they are in.
    assert sent.body == request_body
    assert sent.headers["Content-Encoding"] == "gzip"
    assert sent.headers["Content-Length"] == str(len(request_body))
    assert sent.headers["Accept-Encoding"] == "gzip"


async def test_proxy_adds_no_accept_encoding_the_client_did_not_send(
    proxy: RunningProxy, upstream: FakeUpstream
) -> None:
    async with (
        aiohttp.ClientSession(skip_auto_headers=("Accept-Encoding", "User-Agent")) as bare,
        bare.post(f"{proxy.url}/v1/chat/completions", data=b"{}") as response,
    ):
        assert response.status == 200
    sent = upstream.requests[-1].headers
    assert "Accept-Encoding" not in sent
    assert "User-Agent" not in sent


async def test_fifty_concurrent_requests_through_one_app(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    async def one(i: int) -> bytes:
        body = b'{"model":"m","messages":[{"role":"user","content":"%d"}]}' % i
        async with client.post(f"{proxy.url}/s/c{i}/v1/chat/completions", data=body) as r:
            assert r.status == 200
            await r.read()
        return body

    sent = await asyncio.gather(*(one(i) for i in range(50)))
    assert sorted(r.body for r in upstream.requests) == sorted(sent)
