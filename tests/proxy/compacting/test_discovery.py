"""Windows discovered, not typed (`models.discover`): a model the configuration does not name
gets the window its upstream publishes (a fake vLLM, a fake Ollama), looked up once; the record
says where the window came from, and the configured default stays when nothing is published."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from proxy.settings import ModelsSettings
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


def test_discovery_is_on_by_default() -> None:
    assert ModelsSettings().discover is True
    shipped = yaml.safe_load(Path("config.yaml").read_text())
    assert shipped["models"]["discover"] is True


async def test_one_listing_call_per_model_across_many_requests(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    listing = {
        "data": [
            {"id": "gpt-test", "max_model_len": _PUBLISHED},
            {"id": "gpt-other", "max_model_len": _PUBLISHED},
        ]
    }
    upstream.default = publishing(upstream.default, listing=listing, ollama=None)
    proxy = await start(models={"default_context_window": _DEFAULT, "discover": True})
    messages = conversation_of(int(_PUBLISHED * 1.5))
    for model in ("gpt-test", "gpt-other"):
        for _ in range(3):
            response = await post(client, proxy, messages, model=model)
            assert response.status == 200
    assert lookups(upstream) == ["/v1/models", "/v1/models"]  # one per model, never again


async def test_the_answers_of_at_most_max_models_models_are_kept(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    # A client names any model it likes: one answer each, kept for ever, grew without bound.
    models = ("gpt-a", "gpt-b", "gpt-c")
    listing = {"data": [{"id": model, "max_model_len": _PUBLISHED} for model in models]}
    upstream.default = publishing(upstream.default, listing=listing, ollama=None)
    proxy = await start(
        models={"default_context_window": _DEFAULT, "discover": True, "max_models": 2}
    )
    messages = conversation_of(int(_PUBLISHED * 1.5))
    for turn, model in enumerate((*models, "gpt-c", "gpt-a")):
        # A session each: a request the proxy already knows is not parsed (nor looked up) again.
        response = await post(client, proxy, messages, model=model, session=f"agent-{turn}")
        assert response.status == 200
    # gpt-c, just asked, was remembered; gpt-a, the least recently asked of three, was not.
    assert lookups(upstream) == ["/v1/models"] * 4


async def test_a_404_listing_is_asked_once_and_is_no_error(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    async def nothing_published(request: web.Request, up: FakeUpstream) -> web.StreamResponse:
        if request.path.startswith("/api/") or request.path == "/v1/models":
            return web.json_response({"error": "not found"}, status=404)
        return await inner(request, up)

    inner = upstream.default
    upstream.default = nothing_published
    proxy = await start(models={"default_context_window": _DEFAULT, "discover": True})
    messages = conversation_of(int(_PUBLISHED * 1.5))
    for model in ("gpt-test", "gpt-other", "gpt-third"):
        for _ in range(3):
            response = await post(client, proxy, messages, model=model)
            assert response.status == 200
            assert response.headers["x-compaction-status"] == "none"
    asked = [r.path for r in upstream.requests if not r.path.endswith("/chat/completions")]
    # Each place once for the first model; after their 404s, no model asks them again.
    assert asked == ["/v1/models", "/api/show", "/api/v0/models/gpt-test"]
    async with client.get(f"{proxy.url}/metrics") as response:
        metrics = await response.text()
    errors = [
        line
        for line in metrics.splitlines()
        if "error" in line and not line.startswith("#") and not line.rstrip().endswith(" 0.0")
    ]
    assert errors == []


async def test_a_slow_listing_delays_a_request_at_most_the_timeout(
    start: Any, script: Script, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    listing = {"data": [{"id": "gpt-test", "max_model_len": _PUBLISHED}]}
    served = publishing(upstream.default, listing=listing, ollama=None)
    release, answered = asyncio.Event(), asyncio.Event()

    async def held_listing(request: web.Request, up: FakeUpstream) -> web.StreamResponse:
        if request.path != "/v1/models":
            return await served(request, up)
        await release.wait()
        response = await served(request, up)
        answered.set()
        return response

    upstream.default = held_listing
    proxy = await start(
        models={"default_context_window": _DEFAULT, "discover": True, "discover_timeout_s": 0.1}
    )
    messages = conversation_of(int(_PUBLISHED * 1.5))
    # The listing does not answer until released: a request waiting on it would never end.
    response = await asyncio.wait_for(post(client, proxy, messages), 30)
    assert response.headers["x-compaction-status"] == "none"  # the default window, meanwhile
    release.set()
    await asyncio.wait_for(answered.wait(), 10)
    await asyncio.sleep(0.2)  # the lookup settles in the background and serves what follows
    response = await post(client, proxy, conversation_of(int(_PUBLISHED * 1.6)))
    assert response.headers["x-compaction-status"] == "applied"
    assert lookups(upstream) == ["/v1/models"]
