"""Structured logging: one JSON object per line, and the one access line per request.

Fields passed with `extra=` become JSON fields. What a request line carries is fixed by
`RequestInfo`: method, path (no query string), status, duration, session, upstream status and
what happened to the stream. Never a header value, a credential or a body.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, ClassVar

import orjson

ACCESS_LOGGER = "proxy.access"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    # One (second, its text) pair, replaced whole: a thread never sees a second's text paired
    # with another second.
    _second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        return self.encode(record).decode()

    def encode(self, record: logging.LogRecord) -> bytes:
        """The line as UTF-8 JSON, without its newline."""
        entry: dict[str, object] = {
            "ts": self.timestamp(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if isinstance(record, _AccessRecord):
            entry.update(record._fields)
        else:
            for key, value in vars(record).items():
                if key not in _STANDARD_ATTRS and not key.startswith("_"):
                    entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=repr)

    def timestamp(self, created: float, msecs: float | None = None) -> str:
        """`created` (time.time()) as ISO 8601 UTC with milliseconds; `msecs` as a record has it."""
        # strftime is the slowest part of a log line; one access line per request makes the
        # per-second cache worth its three lines.
        second, text = self._second
        if int(created) != second:
            second = int(created)
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        millis = int(created * 1000) % 1000 if msecs is None else int(msecs)
        return f"{text}.{millis:03d}Z"


class JsonLines(logging.Handler):
    """Each record as a JSON line on a binary stream; the access lines written in batches.

    An access line written on an event loop's thread (`write_access`, one per request) waits in
    a buffer for at most `flush_s`, or until `max_pending` bytes wait: written one by one, they
    were a system call per request, a visible share of a small request's cost. Any other record
    is written at once, after the lines that wait, so the order is kept. Logging flushes every
    handler at exit, so only a killed process loses its last `flush_s` of access lines."""

    def __init__(
        self, stream: IO[bytes], *, flush_s: float = 0.1, max_pending: int = 64 * 1024
    ) -> None:
        super().__init__()
        self.stream = stream
        self.flush_s = flush_s
        self.max_pending = max_pending
        self.formatter: JsonFormatter = JsonFormatter()
        self._guard = threading.RLock()
        self.lock = self._guard  # the one Handler.handle() holds around emit
        self._pending: list[bytes] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:  # with the lock held (Handler.handle)
        try:
            line = self.formatter.encode(record)
        except Exception:
            self.handleError(record)
            return
        self._pending += (line, b"\n")
        self.flush()

    def write_access(self, fields: dict[str, object]) -> None:
        """The access line of `fields`: what `emit` writes for log_request's record."""
        entry = {
            "ts": self.formatter.timestamp(time.time()),
            "level": "INFO",
            "logger": ACCESS_LOGGER,
            "msg": "request",
            **fields,
        }
        line = orjson.dumps(entry, default=repr)
        with self._guard:
            self._pending += (line, b"\n")
            self._size += len(line) + 1
            loop = asyncio._get_running_loop()
            if loop is None or self._size >= self.max_pending:
                self.flush()
            elif self._timer is None or self._timer_loop is not loop:  # (or a loop gone since)
                self._timer = loop.call_later(self.flush_s, self._due, loop)
                self._timer_loop = loop

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        # The timer is never cancelled (a flush may run on another thread, and a loop's timers
        # are its own thread's): it fires, finds what waits now, if anything, and writes it.
        with self._guard:
            if self._timer_loop is loop:
                self._timer = None
        self.flush()

    def flush(self) -> None:
        with self._guard:
            if not self._pending:
                return
            data = b"".join(self._pending)
            self._pending.clear()
            self._size = 0
            try:
                self.stream.write(data)
                self.stream.flush()
            except (OSError, ValueError):  # a closed or broken stderr must not fail a request
                pass


def configure_logging(level: str, stream: IO[bytes] | None = None) -> None:
    """Send every logger's records to `stream` (stderr) as JSON lines at `level`. The access
    logger gets the same handler and does not propagate: a handler added to the root later
    sees every record but the access lines."""
    handler = JsonLines(sys.stderr.buffer if stream is None else stream)
    root = logging.getLogger()
    for replaced in root.handlers:
        replaced.flush()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The access lines go to the same handler, by log_request's direct path.
    access = logging.getLogger(ACCESS_LOGGER)
    access.handlers[:] = [handler]
    access.propagate = False
    # aiohttp's own access log would duplicate ours (and print raw request lines).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@dataclass(slots=True)
class RequestInfo:
    """What one request did, filled in as it goes and logged once at the end."""

    route: str
    started: float = field(default_factory=time.perf_counter)
    session: str | None = None
    upstream_status: int | None = None
    upstream_wait_s: float = 0.0
    # complete, incomplete, upstream_stream_cut, upstream_stream_timeout, client_gone, proxy_error
    outcome: str | None = None

    def overhead_ms(self) -> float:
        """Time since the request arrived, minus the time spent waiting on the upstream."""
        return max(0.0, (time.perf_counter() - self.started - self.upstream_wait_s) * 1000)


_access = logging.getLogger(ACCESS_LOGGER)


# What `LogRecord.__init__` sets that differs from one access line to the next.
_PER_LINE = ("created", "msecs", "relativeCreated", "thread", "threadName")
_LOGGING_STARTED = time.time()


class _AccessRecord(logging.LogRecord):
    """The access line's record. `LogRecord.__init__` works out some twenty attributes per call
    (the caller's file name split three ways, thread and process names), a visible share of a
    pass-through request's CPU, and most are the same for every line `log_request` writes:
    worked out once, copied in (formatters read a record's __dict__). The time and the thread
    are the line's own."""

    _constant: ClassVar[dict[str, object]] = {
        key: value
        for key, value in vars(
            logging.LogRecord(
                ACCESS_LOGGER, logging.INFO, __file__, 0, "request", (), None, "log_request"
            )
        ).items()
        if key not in _PER_LINE
    }

    def __init__(self, fields: dict[str, object]) -> None:  # no super(): that is the point
        created = time.time()
        self.__dict__.update(self._constant)
        self.created = created
        self.msecs = int(created * 1000) % 1000 + 0.0
        self.relativeCreated = (created - _LOGGING_STARTED) * 1000
        thread = threading.current_thread()
        self.thread, self.threadName = thread.ident, thread.name
        self.__dict__.update(fields)
        self._fields = fields


def log_request(method: str, path: str, status: int, info: RequestInfo) -> None:
    if not _access.isEnabledFor(logging.INFO):
        return
    fields: dict[str, object] = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round((time.perf_counter() - info.started) * 1000, 3),
        "session": info.session or "-",
        "route": info.route,
    }
    if info.upstream_status is not None:
        fields["upstream_status"] = info.upstream_status
    if info.outcome is not None:
        fields["outcome"] = info.outcome
    handlers = _access.handlers
    if (
        len(handlers) == 1
        and type(handler := handlers[0]) is JsonLines
        and handler.level <= logging.INFO
        and not (_access.propagate or _access.filters or handler.filters)
    ):
        # As configure_logging leaves it: the line goes to one JSON handler and nowhere else,
        # so it is written without a LogRecord and the logging module's per-record calls
        # (about two thirds of the line's cost). Any other setup gets a full record.
        try:
            handler.write_access(fields)
            return
        except Exception:  # the record's way reports it (Handler.handleError), never raises
            pass
    _access.handle(_AccessRecord(fields))
