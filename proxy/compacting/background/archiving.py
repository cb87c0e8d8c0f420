"""Each compaction's folded messages, archived (proxy.state.archive) in the background.

The turns a compaction folds for the first time (its checkpoint's range past what its base
folded) are kept verbatim under the request's session, credential and conversation; a turn
already archived is kept once. The write is a background task: it never delays a request, and one
that fails is counted, said once in the log until a write succeeds again, and the request goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import orjson

from compaction import Message, Shape, read_items
from proxy.metrics import ArchiveMetrics
from proxy.state.archive import Archive, Entry, Kind, Scope
from proxy.tasks import BackgroundTasks

if TYPE_CHECKING:  # background work sits below the decision: a request's parts are only read
    from proxy.compacting.decision.request import ParsedRequest

log = logging.getLogger(__name__)


class Archiving:
    def __init__(
        self,
        archive: Archive,
        metrics: ArchiveMetrics,
        tasks: BackgroundTasks,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._archive = archive
        self._metrics = metrics
        self._tasks = tasks
        self._clock = clock
        self._failing = False

    def keep(self, req: ParsedRequest, folded: range, compaction_id: str) -> None:
        """Archive `req.messages[folded]` (positions in the client's list) in the background."""
        if not folded or self._tasks.closed:
            return
        scope = Scope(req.session_id, req.conversation)
        messages = req.messages[folded.start : folded.stop]
        self._tasks.spawn(
            self._write(scope, req.dialect.name, req.dialect.shape, messages, folded.start,
                        compaction_id),
            name=f"archive:{req.session_id}",
        )  # fmt: skip

    async def _write(
        self,
        scope: Scope,
        dialect: str,
        shape: Shape,
        messages: Sequence[Message],
        start: int,
        compaction_id: str,
    ) -> None:
        try:
            at = self._clock()
            entries = await asyncio.to_thread(
                build_entries, messages, shape, start=start, dialect=dialect,
                compaction_id=compaction_id, at=at,
            )  # fmt: skip
            dropped = await self._archive.add(scope, entries)
        except Exception as exc:  # fail open: the archive is never the request's business
            self._metrics.failures.inc()
            if not self._failing:
                log.warning(
                    "archive write failed; requests go on, folded turns are not archived",
                    extra={"backend": self._archive.name, "error": repr(exc)},
                )
            self._failing = True
            return
        if self._failing:
            log.info("archive writes succeed again", extra={"backend": self._archive.name})
        self._failing = False
        self._metrics.archived.inc(len(entries))
        for reason, count in dropped.items():
            if count:
                self._metrics.dropped.labels(reason=reason).inc(count)


def build_entries(
    messages: Sequence[Message],
    shape: Shape,
    *,
    start: int,
    dialect: str,
    compaction_id: str,
    at: float,
) -> list[Entry]:
    """The archive's entries for `messages`, the first at position `start`: each message's JSON
    as sent, its kind, and the text a search reads (its prose, its calls' names and
    arguments)."""
    entries = []
    for offset, (message, item) in enumerate(
        zip(messages, read_items(messages, shape), strict=True)
    ):
        kind: Kind = "tool_output" if item.kind == "tool" or item.observation else "message"
        calls = " ".join(f"{call.name or ''} {call.arguments}" for call in item.calls)
        text = f"{item.text}\n{calls}" if calls else item.text
        body = orjson.dumps(message).decode()
        entries.append(Entry.of(start + offset, dialect, kind, compaction_id, at, body, text))
    return entries
