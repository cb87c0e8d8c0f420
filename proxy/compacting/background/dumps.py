"""The debug dump (`logging.dump_dir`): for each compacted request (applied, reused, shadow),
the body as received and as compacted, with a line about the request whose credentials are
redacted.

One dump is three files sharing a name: `{seq}-{session}.received.json` (the client's bytes),
`{seq}-{session}.compacted.json` (what `on` forwards: in shadow mode it was computed and not
sent) and `{seq}-{session}.meta.json` (time, route, session, status, compaction id, token
figures, the request's headers with every credential replaced by "[redacted]"). The oldest dumps
go first once the folder holds more than `dump_max_files` files or `dump_max_mb` MiB; a dump
larger than the whole budget is not written. Files are written off the event loop, one dump at
a time, `0600` in a folder created `0700`; a dump that fails is logged and never fails its
request.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

REDACTED = "[redacted]"
# Header names that carry a credential, whatever their exact spelling.
_SECRET_NAME = re.compile(r"auth|key|token|secret|cookie|password|credential", re.IGNORECASE)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SESSION_CHARS = 64
_PARTS = ("received", "compacted", "meta")


@dataclass(frozen=True)
class Dump:
    """One compacted request to dump: its bodies and what the meta file says of it."""

    session_id: str
    received: bytes
    compacted: bytes
    meta: Mapping[str, object]
    headers: Mapping[str, str]


def redact(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` with the value of each credential-bearing one replaced."""
    return {
        str(name): REDACTED if _SECRET_NAME.search(name) else value
        for name, value in headers.items()
    }


class RequestDumps:
    def __init__(
        self, folder: Path, *, max_files: int, max_bytes: int, tasks: BackgroundTasks
    ) -> None:
        self._folder = folder
        self._max_files = max_files
        self._max_bytes = max_bytes
        self._tasks = tasks
        self._lock = threading.Lock()  # one dump written (and the folder trimmed) at a time
        self._kept: deque[tuple[list[Path], int]] | None = None  # read from the folder once
        self._bytes = 0
        self._files = 0
        self._seq = 0

    def dump(self, dump: Dump) -> None:
        """Write `dump` in the background; never raises."""
        try:
            self._tasks.spawn(self._write_off_loop(dump), name="dump")
        except Exception:
            log.exception("debug dump not started")

    async def _write_off_loop(self, dump: Dump) -> None:
        try:
            await asyncio.to_thread(self.write, dump)
        except Exception:
            log.exception("debug dump failed", extra={"session": dump.session_id})

    def write(self, dump: Dump) -> None:
        """Write `dump` now (in the calling thread), then trim the folder to its bounds."""
        meta = {
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            **dump.meta,
            "headers": redact(dump.headers),
        }
        contents = (dump.received, dump.compacted, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
        size = sum(len(content) for content in contents)
        if size > self._max_bytes or len(contents) > self._max_files:
            log.warning("debug dump larger than logging.dump_max_mb; not written")
            return
        with self._lock:
            kept = self._load()
            while kept and (
                self._bytes + size > self._max_bytes
                or self._files + len(contents) > self._max_files
            ):
                self._drop(kept.popleft())
            self._seq += 1
            stem = f"{self._seq:08d}-{_UNSAFE.sub('_', dump.session_id)[:_SESSION_CHARS]}"
            paths = [self._folder / f"{stem}.{part}.json" for part in _PARTS]
            kept.append((paths, size))
            self._bytes += size
            self._files += len(paths)
            for path, content in zip(paths, contents, strict=True):
                _write_private(path, content)

    def _load(self) -> deque[tuple[list[Path], int]]:
        """The dumps already in the folder (a restart keeps within the bounds), oldest first."""
        if self._kept is not None:
            return self._kept
        self._folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        groups: dict[str, list[Path]] = {}
        for path in sorted(self._folder.glob("*.json")):
            stem, _, rest = path.name.partition(".")
            if rest.removesuffix(".json") in _PARTS and stem[:8].isdigit():
                groups.setdefault(stem, []).append(path)
        kept: deque[tuple[list[Path], int]] = deque()
        for stem, paths in sorted(groups.items()):
            size = sum(path.stat().st_size for path in paths)
            kept.append((paths, size))
            self._bytes += size
            self._files += len(paths)
            self._seq = max(self._seq, int(stem[:8]))
        self._kept = kept
        return kept

    def _drop(self, dump: tuple[list[Path], int]) -> None:
        paths, size = dump
        for path in paths:
            path.unlink(missing_ok=True)
        self._bytes -= size
        self._files -= len(paths)


def _write_private(path: Path, content: bytes) -> None:
    """Write `content` to `path`, readable by this user only (it holds conversations)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(content)
