"""Structured logging: one JSON object per line, and the one access line per request.

Fields passed with `extra=` become JSON fields. What a request line carries is fixed by
`RequestInfo`: method, path (no query string), status, duration, session, upstream status and
what happened to the stream. Never a header value, a credential or a body.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

ACCESS_LOGGER = "proxy.access"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    _second = -1
    _second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": f"{self._timestamp(record.created)}.{int(record.msecs):03d}Z",
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
        return orjson.dumps(entry, default=repr).decode()

    def _timestamp(self, created: float) -> str:
        # strftime is the slowest part of a log line; one access line per request makes the
        # per-second cache worth its three lines.
        second = int(created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return self._second_text


def configure_logging(level: str) -> None:
    """Send every logger's records to stderr as JSON lines at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's own access log would duplicate ours (and print raw request lines).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@dataclass
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

    _constant: ClassVar[dict[str, Any]] = {
        key: value
        for key, value in vars(
            logging.LogRecord(
                ACCESS_LOGGER, logging.INFO, __file__, 0, "request", (), None, "log_request"
            )
        ).items()
        if key not in _PER_LINE
    }

    def __init__(self, fields: dict[str, Any]) -> None:  # no super(): that is the point
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
    fields: dict[str, Any] = {
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
    _access.handle(_AccessRecord(fields))
