"""Windows discovered, not typed (`models.discover`): a model the configuration does not name
gets the window its upstream publishes (a fake vLLM, a fake Ollama), looked up once; the record
says where the window came from, and the configured default stays when nothing is published."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream, Reply
from tests.proxy.compacting.conftest import conversation_of, post

_PUBLISHED = 16000
_DEFAULT = 128000


def publishing(inner: Reply, *, listing: dict[str, Any], ollama: dict[str, Any] | None) -> Reply:
    """The scripted upstream, plus a model listing (and Ollama's /api/show when given)."""

    async def answer(request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/v1/models":
            return web.json_response(listing)
        if request.path == "/api/show":
            if ollama is None:
                return web.json_response({"error": "not found"}, status=404)
            return web.json_response(ollama)
        if request.path.startswith("/api/"):
            return web.json_response({"error": "not found"}, status=404)
        return await inner(request, upstream)

    return answer


async def records_of(client: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    headers = {"Authorization": "Bearer admin-secret"}
    async with client.get(f"{url}/admin/sessions/agent-1", headers=headers) as response:
        found = await response.json()
    records: list[dict[str, Any]] = found["records"]
    return records


def lookups(upstream: FakeUpstream) -> list[str]:
    return [r.path for r in upstream.requests if r.path in ("/v1/models", "/api/show")]


async def test_a_window_published_by_vllm_is_used(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    listing = {"object": "list", "data": [{"id": "gpt-test", "max_model_len": _PUBLISHED}]}
    upstream.default = publishing(upstream.default, listing=listing, ollama=None)
    proxy = await start(models={"default_context_window": _DEFAULT, "discover": True})
    # Far below the default window, over the published one.
    response = await post(client, proxy, conversation_of(int(_PUBLISHED * 1.5)))
    assert response.headers["x-compaction-status"] == "applied"
    record = (await records_of(client, proxy.url))[-1]
    assert record["window"] == _PUBLISHED
    assert record["window_source"] == "discovered: GET /v1/models"
    await post(client, proxy, conversation_of(int(_PUBLISHED * 1.6)))
    assert lookups(upstream) == ["/v1/models"]  # once per model


async def test_a_window_published_by_ollama_is_used(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    listing = {"object": "list", "data": [{"id": "gpt-test", "object": "model"}]}
    shown = {"parameters": "temperature 0.7", "model_info": {"qwen3.context_length": _PUBLISHED}}
    upstream.default = publishing(upstream.default, listing=listing, ollama=shown)
    proxy = await start(models={"default_context_window": _DEFAULT, "discover": True})
    response = await post(client, proxy, conversation_of(int(_PUBLISHED * 1.5)))
    assert response.headers["x-compaction-status"] == "applied"
    record = (await records_of(client, proxy.url))[-1]
    assert record["window"] == _PUBLISHED
    assert record["window_source"] == "discovered: POST /api/show (Ollama)"
    show = next(r for r in upstream.requests if r.path == "/api/show")
    assert show.json() == {"model": "gpt-test"}


async def test_nothing_published_keeps_the_default_and_asks_once(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    upstream.default = publishing(upstream.default, listing={"data": []}, ollama=None)
    proxy = await start(models={"default_context_window": _DEFAULT, "discover": True})
    for _ in range(2):
        response = await post(client, proxy, conversation_of(int(_PUBLISHED * 1.5)))
        assert response.headers["x-compaction-status"] == "none"
    assert lookups(upstream) == ["/v1/models", "/api/show"]


async def test_a_configured_window_is_never_looked_up(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    listing = {"data": [{"id": "gpt-test", "max_model_len": _PUBLISHED}]}
    upstream.default = publishing(upstream.default, listing=listing, ollama=None)
    proxy = await start(
        models={
            "default_context_window": _DEFAULT,
            "discover": True,
            "context_windows": {"gpt-*": _DEFAULT},
        }
    )
    response = await post(client, proxy, conversation_of(int(_PUBLISHED * 1.5)))
    assert response.headers["x-compaction-status"] == "none"
    assert lookups(upstream) == []
