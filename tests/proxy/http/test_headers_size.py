"""Request headers past the limit: a 431 in the API's error shape, and nothing in the logs that
quotes the header (it can be an API key or the admin token)."""

from __future__ import annotations

import logging

import orjson
import pytest

from tests.fakes.rawhttp import raw_request
from tests.fakes.upstream import FakeUpstream
from tests.proxy.conftest import StartProxy
from tests.proxy.http.test_errors import assert_openai_error

SECRET = "sk-proj-DoNotLogMe0123456789"


def _logged_text(caplog: pytest.LogCaptureFixture) -> str:
    """Every record as a handler would write it: message, traceback and extra fields."""
    formatter = logging.Formatter()
    return "\n".join(formatter.format(record) + repr(record.__dict__) for record in caplog.records)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/chat/completions", "Authorization"),
        ("/v1/models", "Authorization"),
        ("/admin/sessions", "Authorization"),
        ("/healthz", "x-api-key"),
    ],
)
async def test_a_header_past_8_kb_is_a_431_and_no_log_quotes_it(
    start_proxy: StartProxy,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    path: str,
    name: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = await start_proxy(admin={"token": "t" * 32})
    value = f"Bearer {SECRET}" + "A" * 9000
    status, body = await raw_request(proxy.port, "GET", path, {name: value})
    assert status == 431
    assert_openai_error(body, "request_header_too_large")
    assert SECRET not in body.decode()
    assert upstream.requests == []
    assert SECRET not in _logged_text(caplog)
    assert "Bearer" not in _logged_text(caplog)


async def test_a_header_past_8_kb_on_anthropics_route_gets_anthropics_shape(
    start_proxy: StartProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = await start_proxy()
    status, body = await raw_request(
        proxy.port, "POST", "/v1/messages", {"x-api-key": SECRET + "A" * 9000}, b"{}"
    )
    assert status == 431
    assert orjson.loads(body)["type"] == "error"
    assert SECRET not in _logged_text(caplog)


async def test_a_header_the_parser_refuses_is_logged_without_quoting_it(
    start_proxy: StartProxy, caplog: pytest.LogCaptureFixture
) -> None:
    # Past the parser's own bound aiohttp answers by itself; its log line still quotes nothing.
    caplog.set_level(logging.DEBUG)
    proxy = await start_proxy()
    status, _ = await raw_request(
        proxy.port, "GET", "/healthz", {"Authorization": f"Bearer {SECRET}" + "A" * 70_000}
    )
    assert status == 400
    logged = _logged_text(caplog)
    assert SECRET not in logged
    assert "LineTooLong" in logged  # said, as a kind, at WARNING
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_headers_within_the_limit_pass(
    start_proxy: StartProxy, upstream: FakeUpstream
) -> None:
    proxy = await start_proxy()
    status, _ = await raw_request(proxy.port, "GET", "/v1/models", {"x-big": "A" * 8190})
    assert status == 200
    assert upstream.requests[-1].headers["x-big"] == "A" * 8190
