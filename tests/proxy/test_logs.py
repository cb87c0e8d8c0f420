"""The CLI's log handler (proxy.logs.JsonLines): access lines batched, never lost or reordered,
and written as the full record path writes them; the lean access record reads exactly as the
standard LogRecord it replaces (same attributes for any formatter)."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from proxy.logs import (
    ACCESS_LOGGER,
    JsonFormatter,
    JsonLines,
    RequestInfo,
    _AccessRecord,
    configure_logging,
    log_request,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stream() -> Iterator[io.BytesIO]:
    """A BytesIO the CLI's logging setup writes to; the logging setup before is put back."""
    root, access = logging.getLogger(), logging.getLogger(ACCESS_LOGGER)
    saved = (root.handlers[:], root.level, access.handlers[:], access.propagate)
    out = io.BytesIO()
    configure_logging("INFO", stream=out)
    try:
        yield out
    finally:
        root.handlers[:], level, access.handlers[:], access.propagate = saved
        root.setLevel(level)


def _handler() -> JsonLines:
    """The CLI's handler, alone on the access logger again: pytest's log capture adds its own
    handlers to the loggers while a test runs, which sends access lines the full-record way."""
    access = logging.getLogger(ACCESS_LOGGER)
    handler = access.handlers[0]
    assert isinstance(handler, JsonLines)
    access.handlers[:] = [handler]
    return handler


def _lines(out: io.BytesIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


def _info(session: str) -> RequestInfo:
    return RequestInfo(route="chat", session=session, upstream_status=200, outcome="complete")


async def test_access_lines_on_the_loop_wait_for_the_flush_then_go_out_together(
    stream: io.BytesIO,
) -> None:
    _handler().flush_s = 0.05
    for n in range(3):
        log_request("POST", "/v1/chat/completions", 200, _info(f"s-{n}"))
    assert stream.getvalue() == b""
    await asyncio.sleep(0.2)
    assert [line["session"] for line in _lines(stream)] == ["s-0", "s-1", "s-2"]


async def test_the_direct_line_is_the_line_the_full_record_gives(stream: io.BytesIO) -> None:
    handler = _handler()
    log_request("POST", "/v1/chat/completions", 200, _info("s-1"))
    assert stream.getvalue() == b""  # the direct path: waiting
    handler.flush()
    (direct,) = _lines(stream)
    fields = {key: direct[key] for key in list(direct)[4:]}
    via_record = orjson.loads(JsonFormatter().encode(_AccessRecord(fields)))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(direct["ts"]))
    assert direct.pop("ts") and via_record.pop("ts")
    assert direct == via_record
    assert direct["logger"] == ACCESS_LOGGER and direct["msg"] == "request"
    assert direct["route"] == "chat" and direct["upstream_status"] == 200


async def test_any_other_record_goes_out_at_once_after_the_lines_that_wait(
    stream: io.BytesIO,
) -> None:
    _handler()
    log_request("POST", "/v1/chat/completions", 200, _info("s-1"))
    assert stream.getvalue() == b""
    logging.getLogger("proxy.test").info("listening")
    assert [line["msg"] for line in _lines(stream)] == ["request", "listening"]
    log_request("GET", "/healthz", 200, _info("s-2"))
    logging.getLogger("proxy.test").warning("upstream failed mid-response")
    assert [line["msg"] for line in _lines(stream)][2:] == [
        "request",
        "upstream failed mid-response",
    ]


async def test_lines_past_the_size_bound_go_out_without_waiting(stream: io.BytesIO) -> None:
    _handler().max_pending = 600  # an access line is about 230 bytes
    for n in range(3):
        log_request("POST", "/v1/chat/completions", 200, _info(f"s-{n}"))
    assert [line["session"] for line in _lines(stream)] == ["s-0", "s-1", "s-2"]


def test_a_line_from_a_thread_without_a_loop_goes_out_at_once(stream: io.BytesIO) -> None:
    _handler()
    elsewhere = threading.Thread(
        target=log_request, args=("GET", "/healthz", 200, _info("s-t")), name="no-loop"
    )
    elsewhere.start()
    elsewhere.join()
    assert [line["session"] for line in _lines(stream)] == ["s-t"]


async def test_a_second_handler_on_the_access_logger_gets_the_full_record(
    stream: io.BytesIO,
) -> None:
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    _handler()
    access = logging.getLogger(ACCESS_LOGGER)
    access.addHandler(Keep())
    log_request("POST", "/v1/chat/completions", 200, _info("s-1"))
    assert [record.getMessage() for record in seen] == ["request"]
    assert vars(seen[0])["session"] == "s-1"
    assert [line["session"] for line in _lines(stream)] == ["s-1"]  # written at once


async def test_a_broken_stream_fails_no_request(stream: io.BytesIO) -> None:
    handler = _handler()
    stream.close()  # writing raises ValueError from now on
    log_request("POST", "/v1/chat/completions", 200, _info("s-1"))
    handler.flush()
    logging.getLogger("proxy.test").warning("still fine")


async def test_a_thread_that_logs_while_lines_wait_writes_them_first(
    stream: io.BytesIO,
) -> None:
    _handler().flush_s = 0.05
    log_request("POST", "/v1/chat/completions", 200, _info("s-1"))  # waits, its timer set
    warn = threading.Thread(target=logging.getLogger("proxy.test").warning, args=("from a thread",))
    warn.start()
    warn.join()
    assert [line["msg"] for line in _lines(stream)] == ["request", "from a thread"]
    log_request("POST", "/v1/chat/completions", 200, _info("s-2"))
    await asyncio.sleep(0.2)  # the first timer fires (nothing left), then the second's
    assert [line.get("session") for line in _lines(stream)] == ["s-1", None, "s-2"]


def test_lines_that_wait_are_written_when_the_process_exits(tmp_path: Path) -> None:
    program = (
        "import asyncio\n"
        "from proxy.logs import RequestInfo, configure_logging, log_request\n"
        "configure_logging('INFO')\n"
        "async def main():\n"
        "    log_request('GET', '/healthz', 200, RequestInfo(route='healthz'))\n"
        "asyncio.run(main())\n"  # exits at once: the 100 ms have not passed
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert orjson.loads(line)["path"] == "/healthz"


def test_the_access_record_carries_every_attribute_a_formatter_may_ask_for() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(levelno)d %(name)s %(pathname)s %(filename)s "
            "%(module)s %(lineno)d %(funcName)s %(process)d %(processName)s %(thread)d "
            "%(threadName)s %(relativeCreated)d %(msecs)d %(message)s %(method)s %(status)d"
        )
    )
    json_stream = io.StringIO()
    json_handler = logging.StreamHandler(json_stream)
    json_handler.setFormatter(JsonFormatter())
    access = logging.getLogger("proxy.access")
    access.addHandler(handler)
    access.addHandler(json_handler)
    previous = access.level
    access.setLevel(logging.INFO)
    try:
        info = RequestInfo(route="chat", session="s-1", upstream_status=200, outcome="complete")
        log_request("POST", "/v1/chat/completions", 200, info)
        # A loop run in another thread than the one that imported proxy.logs: its own thread.
        elsewhere = threading.Thread(
            target=log_request, args=("GET", "/healthz", 200, info), name="loop-thread"
        )
        elsewhere.start()
        elsewhere.join()
    finally:
        access.removeHandler(handler)
        access.removeHandler(json_handler)
        access.setLevel(previous)

    text, other = stream.getvalue().splitlines()
    assert f" {threading.get_ident()} MainThread " in text
    assert f" {elsewhere.ident} loop-thread " in other
    assert " INFO 20 proxy.access " in text
    assert "logs.py logs 0 log_request" in text
    assert text.rstrip().endswith("request POST 200")
    line = orjson.loads(json_stream.getvalue().splitlines()[0])
    assert line.pop("ts").endswith("Z")
    assert line == {
        "level": "INFO",
        "logger": "proxy.access",
        "msg": "request",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "duration_ms": line["duration_ms"],
        "session": "s-1",
        "route": "chat",
        "upstream_status": 200,
        "outcome": "complete",
    }
