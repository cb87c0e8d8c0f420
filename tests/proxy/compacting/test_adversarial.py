"""Faults an adversarial pass found in compaction, end to end through the real proxy."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from compaction import Compaction, Compactor, Message, is_summary_message
from proxy.compacting.fast import BodyIndexes
from tests.fakes.script import Script, tokens
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, with_hook
from tests.proxy.conftest import RunningProxy, StartProxy

ADMIN = {"Authorization": "Bearer admin-secret"}


async def records_of(
    client: aiohttp.ClientSession, proxy: RunningProxy, session: str
) -> list[dict[str, Any]]:
    async with client.get(f"{proxy.url}/admin/sessions/{session}", headers=ADMIN) as response:
        assert response.status == 200
        records: list[dict[str, Any]] = (await response.json())["records"]
        return records


async def test_a_symlinked_memory_file_is_not_followed_and_the_request_still_served(
    start: Any, script: Script, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious\n")
    link = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    proxy = await start()
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    assert outside.read_bytes() == b"precious\n"
    (record,) = await records_of(client, proxy, "agent-1")
    assert any("memory flush failed" in error for error in record["errors"])


async def test_a_compacted_request_keeps_every_other_field_byte_for_byte(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    messages = orjson.dumps(conversation_of(int(WINDOW * 1.2)))
    head = b'{ "model" : "gpt-test",\n  "seed": 123456789012345678901234567890123, "messages" : '
    tail = b', "temperature": 1.50, "n": 1E0, "metadata": {"tag": "caf\\u00e9"} }'
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=head + messages + tail,
        headers={"Content-Type": "application/json", "X-Session-Id": "agent-1"},
    ) as response:
        assert response.headers["x-compaction-status"] == "applied"
    (sent,) = script.calls(None)
    assert sent.body.startswith(head) and sent.body.endswith(tail)
    assert is_summary_message(orjson.loads(sent.body)["messages"][1])


def _overflow_once(script: Script, limit: int) -> list[int]:
    """The agent's first chat call answers a context-length error naming `limit`."""
    chat = script.chat
    seen: list[int] = []

    async def reply(request: web.Request) -> web.StreamResponse:
        seen.append(1)
        if len(seen) == 1:
            error = {
                "message": f"This model's maximum context length is {limit} tokens. However, "
                "your messages resulted in 3100 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
            return web.json_response({"error": error}, status=400)
        return await chat(request)

    script.chat = reply
    return seen


async def test_headers_after_an_overflow_retry_describe_the_retried_request(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    _overflow_once(script, 2000)
    response = await post(client, proxy, conversation_of(int(WINDOW * 0.7)))
    assert response.status == 200 and len(script.calls(None)) == 2
    assert response.headers["x-compaction-status"] == "applied"
    before = int(response.headers["x-compaction-tokens-before"])
    after = int(response.headers["x-compaction-tokens-after"])
    assert after < 2000 < before
    assert response.headers["x-compaction-id"]


async def test_an_overflow_on_an_unparsed_body_is_compacted_retried_and_the_limit_learned(
    start: Any, script: Script, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # The default 128k window in front of a model that really has 2000 tokens: a 3000-token
    # body is far below anything the proxy would parse.
    proxy = await start(models={"default_context_window": 128000})
    _overflow_once(script, 2000)
    messages = conversation_of(3000)
    with caplog.at_level(logging.INFO):
        first = await post(client, proxy, messages)
        assert first.status == 200 and len(script.calls(None)) == 2
        assert first.headers["x-compaction-status"] == "applied"
        assert tokens(orjson.loads(script.calls(None)[1].body)["messages"]) < 2000
        # Learned: the next request of that model is compacted before it goes out.
        grown = conversation_of(3300, grow=messages)
        second = await post(client, proxy, grown, session="agent-2")
    assert second.status == 200 and len(script.calls(None)) == 3
    assert second.headers["x-compaction-status"] == "applied"
    hints = [r for r in caplog.records if "models.context_windows" in r.getMessage()]
    assert len(hints) == 1


async def test_fingerprint_sessions_are_never_shared_between_credentials(
    start: Any, script: Script, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    proxy = await start(compaction={"summary_request": "standalone"})
    messages = conversation_of(int(WINDOW * 1.2))
    sessions = []
    for key in ("Bearer sk-tenant-a", "Bearer sk-tenant-b"):
        async with client.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "gpt-test", "messages": messages},
            headers={"Authorization": key},
        ) as response:
            assert response.headers["x-compaction-status"] == "applied"
            sessions.append(response.headers["x-compaction-session"])
    assert sessions[0] != sessions[1] and all(s.startswith("fp-") for s in sessions)
    for session in sessions:
        lines = (tmp_path / "memory" / session / "compaction_flush.jsonl").read_text()
        assert "standard library" in lines
        assert len(await records_of(client, proxy, session)) == 1


async def test_admin_preview_chars_bounds_summary_previews_and_zero_disables_them(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    for chars, expected in ((25, 25), (0, 0)):
        proxy = await start(admin={"preview_chars": chars})
        await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
        (record,) = await records_of(client, proxy, "agent-1")
        assert len(record["summary_preview"]) == expected
        assert record["summary_chars"] > 25


class FoldsOnce(Compactor):
    """A compactor whose first compaction folds and whose later ones can fold nothing (say,
    no gain)."""

    prepared = 0

    async def prepare(self, messages: list[Message], **kwargs: Any) -> Compaction:
        compaction = await super().prepare(messages, **kwargs)
        self.prepared += 1
        if self.prepared == 1:
            return compaction
        nothing = dataclasses.replace(compaction.plan, keep_from=compaction.plan.head_end)
        return Compaction(
            self, messages, nothing, tools=compaction.tools, estimator=compaction.estimator
        )


async def test_failed_is_reported_only_when_the_original_request_went_out(
    start_proxy: StartProxy, upstream: FakeUpstream, script: Script, client: aiohttp.ClientSession
) -> None:
    sections: dict[str, Any] = {
        "models": {"default_context_window": WINDOW},
        "compaction": {"keep_recent_rounds": 2, "summary_max_tokens": 300, "precompute_ratio": 0},
    }
    async with with_hook(start_proxy, upstream, sections, compactor=FoldsOnce()) as proxy:
        messages = conversation_of(int(WINDOW * 1.2))
        first = await post(client, proxy, messages)
        assert first.headers["x-compaction-status"] == "applied"
        # Past the trigger again, nothing more can be folded: the earlier compaction still
        # goes out, so this is no failure.
        grown = conversation_of(int(WINDOW * 2.0), grow=messages)
        second = await post(client, proxy, grown)
        assert int(second.headers["x-compaction-tokens-after"]) > 0.85 * WINDOW
        assert second.headers["x-compaction-status"] == "reused"
        assert second.headers["x-compaction-id"] == first.headers["x-compaction-id"]
        # A conversation that could never be compacted: its original goes out, "failed".
        other = conversation_of(int(WINDOW * 1.2))
        other[1] = {"role": "user", "content": "Another task."}
        third = await post(client, proxy, other, session="agent-2")
        assert third.headers["x-compaction-status"] == "failed"
        assert orjson.loads(script.calls(None)[-1].body)["messages"] == other


async def test_a_body_with_a_number_beyond_any_float_is_still_compacted_byte_for_byte(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    huge = b"1" + b"0" * 400  # orjson refuses it: beyond 64 bits and beyond a double
    head = b'{"model": "gpt-test", "seed": ' + huge + b', "messages": '
    tail = b', "logit_bias": {"50256": -1e400}}'
    messages = orjson.dumps(conversation_of(int(WINDOW * 1.2)))
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=head + messages + tail,
        headers={"Content-Type": "application/json", "X-Session-Id": "agent-1"},
    ) as response:
        assert response.status == 200
        assert response.headers["x-compaction-status"] == "applied"
    (sent,) = script.calls(None)
    assert sent.body.startswith(head) and sent.body.endswith(tail)


async def test_a_body_nested_past_the_parsers_depth_goes_out_untouched_with_its_status(
    start: Any, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    nested = b"[" * 3000 + b"]" * 3000
    body = b'{"model":"m","messages":[{"role":"user","content":"x","d":' + nested + b"}]}"
    headers = {"Content-Type": "application/json", "Authorization": "Bearer k"}
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers=headers
    ) as response:
        assert response.status == 200
        assert response.headers["x-compaction-status"] == "none"
    assert upstream.requests[-1].body == body


class _RecognitionFails(BodyIndexes):
    """Remembers long requests like the proxy's own, but recognizing one fails."""

    def recognize(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("recognizing failed")


async def test_a_request_whose_recognition_fails_is_decided_by_the_full_path(
    start_proxy: StartProxy, upstream: FakeUpstream, script: Script, client: aiohttp.ClientSession
) -> None:
    sections: dict[str, Any] = {"models": {"default_context_window": WINDOW}}
    known = _RecognitionFails(max_bytes=64 * 1024 * 1024, min_body_bytes=1024)
    async with with_hook(start_proxy, upstream, sections, indexes=known) as proxy:
        messages = conversation_of(int(WINDOW * 1.2))
        response = await post(client, proxy, messages)
        # Compacted as the full path does it (not passed through without a status).
        assert response.headers["x-compaction-status"] == "applied"
        assert len(orjson.loads(script.calls(None)[-1].body)["messages"]) < len(messages)


async def test_a_string_cut_inside_a_surrogate_pair_is_compacted_and_kept_byte_for_byte(
    start: Any, script: Script, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # An agent in JavaScript that cuts a tool output inside an emoji's UTF-16 pair sends a lone
    # surrogate, which JSON.stringify writes as an escape: valid JSON that orjson refuses.
    proxy = await start()
    messages = conversation_of(int(WINDOW * 1.2))
    messages[3]["content"] += "\ud83d"  # folded
    messages[-1]["content"] += " \ude00 and \\ud83d"  # kept; the second is no escape
    body = json.dumps({"model": "gpt-test", "messages": messages}).encode()
    assert b"\\ud83d" in body and b"\\ude00" in body
    with caplog.at_level(logging.WARNING):
        assert await _compaction_status(client, proxy, body) == "applied"
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    (sent,) = script.calls(None)
    last = json.dumps(messages[-1]).encode()
    assert sent.body.endswith(last + b"]}")


async def test_a_number_beyond_any_float_inside_a_message_is_compacted(
    start: Any, script: Script, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await start()
    messages = orjson.dumps(conversation_of(int(WINDOW * 1.2)))
    huge = b"1" + b"0" * 400  # orjson refuses it: beyond 64 bits and beyond a double
    body = (
        b'{"model": "gpt-test", "messages": '
        + messages.replace(b'"content":', b'"id": ' + huge + b', "content":', 4)
        + b"}"
    )
    with caplog.at_level(logging.WARNING):
        assert await _compaction_status(client, proxy, body) == "applied"
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def _compaction_status(
    client: aiohttp.ClientSession, proxy: RunningProxy, body: bytes
) -> str:
    """Post the chat request `body`; the compaction status of its 200."""
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "X-Session-Id": "agent-1"},
    ) as response:
        assert response.status == 200
        return response.headers["x-compaction-status"]
