"""Codex signed in with a ChatGPT plan: its bodies come `Content-Encoding: zstd`, and its
requests carry the account's headers. A compacted body goes upstream in the client's coding,
and the proxy's own calls carry the account headers of the allow-list (docs/operations.md), so
the ChatGPT backend accepts and bills them where it does the client's requests."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

import aiohttp
import brotli
import orjson
import pytest
from backports import zstd

from compaction import SUMMARY_MARKER
from compaction.messages import RESPONSES
from tests.fakes.script import Script, body_tokens
from tests.proxy.compacting.conftest import WINDOW
from tests.proxy.compacting.test_responses import responses_body

CODINGS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]] = {
    "zstd": (zstd.compress, zstd.decompress),
    "gzip": (gzip.compress, gzip.decompress),
    "br": (brotli.compress, brotli.decompress),
}
ACCOUNT = {
    "chatgpt-account-id": "acct-7f3e",
    "originator": "codex_exec",
    "OpenAI-Organization": "org-42",
    "OpenAI-Project": "proj-9",
}
NOT_FOR_SUMMARIES = {
    "x-codex-turn-metadata": '{"request_kind":"turn"}',
    "x-codex-beta-features": "remote_compaction_v2",
}


async def _send_encoded(
    client: aiohttp.ClientSession, url: str, body: dict[str, Any], coding: str
) -> aiohttp.ClientResponse:
    encode, _ = CODINGS[coding]
    headers = {
        "Content-Type": "application/json",
        "Content-Encoding": coding,
        "Authorization": "Bearer chatgpt-access-token",
        "X-Session-Id": f"codex-{coding}",
        **ACCOUNT,
        **NOT_FOR_SUMMARIES,
    }
    async with client.post(url, data=encode(orjson.dumps(body)), headers=headers) as response:
        await response.read()
        return response


@pytest.mark.parametrize("coding", sorted(CODINGS))
async def test_a_compacted_body_goes_upstream_in_the_clients_coding(
    start: Any, script: Script, client: aiohttp.ClientSession, coding: str
) -> None:
    proxy = await start()
    body = responses_body(int(WINDOW * 1.3), store=False)
    response = await _send_encoded(client, f"{proxy.url}/v1/responses", body, coding)
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    sent = script.calls(None)[-1]
    assert sent.headers["Content-Encoding"] == coding
    _, decode = CODINGS[coding]
    forwarded = orjson.loads(decode(sent.body))
    assert sent.headers["Content-Length"] == str(len(sent.body))
    # Compacted: the summary first, and well under the trigger.
    assert RESPONSES.is_summary(forwarded["input"][0])
    assert SUMMARY_MARKER in forwarded["input"][0]["content"][0]["text"]
    assert body_tokens("/v1/responses", forwarded) < 0.85 * WINDOW
    assert forwarded["store"] is False


async def test_the_proxys_own_calls_carry_the_clients_account_headers(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    body = responses_body(int(WINDOW * 1.3), store=False)
    response = await _send_encoded(client, f"{proxy.url}/v1/responses", body, "zstd")
    assert response.status == 200
    own_calls = script.calls("summary") + script.calls("memory")
    assert script.calls("summary")
    for call in own_calls:
        assert call.headers["Authorization"] == "Bearer chatgpt-access-token"
        for name, value in ACCOUNT.items():
            assert call.headers[name] == value
        for name in NOT_FOR_SUMMARIES:
            assert name not in call.headers
        # The proxy's own body is its own JSON, in no coding.
        assert "Content-Encoding" not in call.headers
        assert orjson.loads(call.body)["model"] == body["model"]
