"""The upstream connection used directly: the proxy's own calls (summaries) go through here."""

from __future__ import annotations

import gzip
import socket

import orjson
import pytest
from yarl import URL

from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.http.upstream import Upstream
from proxy.metrics import Metrics
from proxy.settings import UpstreamSettings
from tests.fakes.upstream import FakeUpstream, hang_reply, json_reply, raw_reply


async def test_post_json_returns_status_and_parsed_answer(upstream: FakeUpstream) -> None:
    upstream.reply_once(
        json_reply({"ok": 1}, status=201),
        raw_reply(gzip.compress(b'{"z": 2}'), headers={"Content-Encoding": "gzip"}),
        raw_reply(b"not json", status=500),
    )
    async with Upstream(UpstreamSettings(base_url=upstream.base_url), Metrics()) as proxied:
        url = proxied.url_for("chat/completions")
        headers = {"X-Compaction-Purpose": "summary", "Content-Type": "application/json"}
        assert await proxied.post_json(url, b"{}", headers, 5) == (201, {"ok": 1})
        assert await proxied.post_json(url, b"{}", headers, 5) == (200, {"z": 2})
        assert await proxied.post_json(url, b"{}", headers, 5) == (500, None)
    assert upstream.requests[0].headers["X-Compaction-Purpose"] == "summary"
    assert orjson.loads(upstream.requests[0].body) == {}


async def test_post_json_failures_are_our_upstream_errors(upstream: FakeUpstream) -> None:
    upstream.reply(hang_reply())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/chat/completions"
    async with Upstream(UpstreamSettings(base_url=upstream.base_url), Metrics()) as proxied:
        with pytest.raises(UpstreamTimeout):
            await proxied.post_json(proxied.url_for("chat/completions"), b"{}", {}, 0.2)
        with pytest.raises(UpstreamUnreachable):
            await proxied.post_json(URL(dead), b"{}", {}, 5)
