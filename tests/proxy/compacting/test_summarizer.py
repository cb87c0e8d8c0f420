"""The summarizer's calls through the real proxy: failures fall back, cool down, credentials and model quirks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from compaction import is_summary_message
from compaction.invariants import check_tool_pairing
from compaction.types import ChatLLM, Purpose
from proxy.compacting.models.llm_client import LLMRequest, ModelParameters
from proxy.http import keys
from tests import factories as f
from tests.fakes.script import MEMORY_TEXT, SUMMARY_TEXT, Script, tokens
from tests.fakes.upstream import chat_completion
from tests.proxy.compacting.conftest import (
    WINDOW,
    conversation_of,
    forwarded,
    post,
)


def _failing(kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def reply(request: web.Request) -> web.StreamResponse:
        if kind == "down":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if kind == "slow":
            await asyncio.sleep(5)
        text = {"empty": "", "nonsense": "!!!", "slow": SUMMARY_TEXT}[kind]
        return web.json_response(chat_completion(text))

    return reply


@pytest.mark.parametrize("kind", ["down", "slow", "empty", "nonsense"])
async def test_a_failing_summarizer_never_fails_the_request(
    kind: str, start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"summary_timeout_s": 0.5})
    script.summary = _failing(kind)
    script.memory = _failing(kind)
    messages = conversation_of(int(WINDOW * 1.3))
    response = await post(client, proxy, messages)
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    out = forwarded(script)[0]["messages"]
    assert is_summary_message(out[1])
    assert check_tool_pairing(out) == []
    assert tokens(out) < 0.85 * WINDOW


async def test_a_compaction_that_falls_back_is_logged_as_a_warning_with_why(
    start: Any, script: Script, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    proxy = await start()
    script.summary = _failing("down")
    await post(client, proxy, conversation_of(int(WINDOW * 1.3)))
    script.summary = Script.answer(SUMMARY_TEXT)
    await post(client, proxy, conversation_of(int(WINDOW * 1.3)), session="fine")
    failed, fine = [r for r in caplog.records if r.name == "proxy.compacting.decision.records"]
    assert failed.levelno == logging.WARNING
    assert failed.errors == ["summary call failed: SummarizerError: summarizer answered HTTP 500"]
    assert fine.levelno == logging.INFO and fine.errors == []


async def test_repeated_summarizer_failures_cool_down(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"failure_threshold": 2, "failure_cooldown_s": 600})
    script.summary = _failing("down")
    for n in range(4):
        response = await post(
            client,
            proxy,
            [*conversation_of(int(WINDOW * 1.2)), f.user(f"new {n}")],
            session=f"s{n}",
        )
        assert response.status == 200 and response.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 2
    # Another tenant's key is not cooled down by the first one's failures.
    await post(
        client, proxy, conversation_of(int(WINDOW * 1.2)), session="t", auth="Bearer sk-other"
    )
    assert len(script.calls("summary")) == 3


async def test_azure_style_keys_and_api_version_reach_the_summarizer(
    start: Any, script: Script, client: Any
) -> None:
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    proxy = await start(compaction={"summary_request": "standalone"})
    body = orjson.dumps({"model": "gpt-test", "messages": conversation_of(int(WINDOW * 1.2))})
    headers = {"Content-Type": "application/json", "api-key": "azure-secret", "X-Session-Id": "az"}
    # Azure OpenAI's deployments refuse a call without its api-version.
    async with client.post(
        f"{proxy.url}/v1/chat/completions?api-version=2024-10-21", data=body, headers=headers
    ) as response:
        assert response.headers["x-compaction-status"] == "applied"
    for call in (*script.calls("summary"), *script.calls("memory")):
        assert call.headers["api-key"] == "azure-secret"
        assert "Authorization" not in call.headers
        assert call.query_string == "api-version=2024-10-21"
    assert script.calls("summary") and script.calls("memory")


async def test_a_client_without_a_key_has_its_summaries_sent_with_the_configured_key(
    start: Any, script: Script, client: Any
) -> None:
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    proxy = await start(
        upstream={"api_key": "sk-configured"}, compaction={"summary_request": "standalone"}
    )
    body = orjson.dumps({"model": "gpt-test", "messages": conversation_of(int(WINDOW * 1.2))})
    headers = {"Content-Type": "application/json", "X-Session-Id": "no-key"}
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers=headers
    ) as response:
        assert response.headers["x-compaction-status"] == "applied"
    for purpose in (None, "summary", "memory"):
        for call in script.calls(purpose):
            assert call.headers["Authorization"] == "Bearer sk-configured"
    assert script.calls("summary") and script.calls("memory")


async def test_a_reasoning_model_that_refuses_max_tokens_and_temperature_still_summarizes(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    answer = Script.answer(SUMMARY_TEXT)

    async def strict(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        for param, code in (
            ("max_tokens", "unsupported_parameter"),
            ("temperature", "unsupported_value"),
        ):
            if param in payload:
                return web.json_response(
                    {
                        "error": {
                            "message": f"Unsupported parameter: '{param}' is not supported with this model.",
                            "type": "invalid_request_error",
                            "param": param,
                            "code": code,
                        }
                    },
                    status=400,
                )
        assert "max_completion_tokens" in payload
        return await answer(request)

    script.summary = strict
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    assert response.headers["x-compaction-status"] == "applied"
    assert proxy.app[keys.RECORDS].get("agent-1")["records"][0]["path"] == "llm"
    # Learned once per model: the next conversation's summary call is right the first time.
    calls = len(script.calls("summary"))
    await post(client, proxy, conversation_of(int(WINDOW * 1.2)), session="second")
    assert len(script.calls("summary")) == calls + 1


def test_what_models_refused_is_kept_for_at_most_max_models() -> None:
    # Model names come from the clients: what is learned of them is bounded like the other
    # per-model state (models.max_models), the least recently learned forgotten first.
    parameters = ModelParameters(max_models=2)
    refusal = {"error": {"param": "max_tokens", "code": "unsupported_parameter"}}
    for model in ("o-first", "o-second", "o-third"):
        assert parameters.learn(model, 400, refusal)
    assert parameters.refused("o-first") == set()
    assert parameters.refused("o-third") == {"max_tokens"}


class RecordingLLMs:
    """`llm_for` that answers from a script and records what each summarizer was built from."""

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []
        self.purposes: list[str] = []

    def __call__(self, request: LLMRequest) -> ChatLLM:
        self.requests.append(request)
        return self

    async def complete(self, messages: list[Any], *, purpose: Purpose, max_tokens: int) -> str:
        self.purposes.append(purpose)
        return SUMMARY_TEXT if purpose == "summary" else MEMORY_TEXT


async def test_an_injected_summarizer_factory_is_asked_with_the_request_model_and_credential(
    start: Any, script: Script, client: Any
) -> None:
    llms = RecordingLLMs()
    proxy = await start({"llm_for": llms})
    response = await post(
        client, proxy, conversation_of(int(WINDOW * 1.2)), auth="Bearer sk-own", model="m2"
    )
    assert response.headers["x-compaction-status"] == "applied"
    assert script.calls("summary") == [] and script.calls("memory") == []
    assert [(r.model, r.credential) for r in llms.requests] == [("m2", "Bearer sk-own")]
    assert "summary" in llms.purposes
    assert SUMMARY_TEXT.splitlines()[1] in orjson.dumps(forwarded(script)[0]).decode()
