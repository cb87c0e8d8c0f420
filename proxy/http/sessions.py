"""Sessions: who a request belongs to (DESIGN §5).

Identity: `X-Session-Id`, then the `/s/{session}/` path, then (decided by the hook, which parses
the body; proxy.compacting.identity) the session the client names in its body, then a
fingerprint of the conversation's opening.

Ids become directory names under `memory.dir`, so they are validated strictly here: the
pattern leaves no room for separators, and a leading dot is refused (no `.`, `..`, hidden dirs).

What the proxy keeps about each session for /admin is proxy.compacting.records; proxy.http
reads it through `AdminRecords`, the part of it the handlers use (create_app passes it in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from compaction import is_valid_session_id
from proxy.errors import SessionIdRefused

SESSION_HEADER = "X-Session-Id"


TimelineLine = tuple[
    float, str, str, int | None, int | None, int, int, str | None, int, float, int, int
]
"""One hooked request as forwarding saw it, in the order of TIMELINE_FIELDS: when it was relayed
(`time.time()`), the route's API shape (chat, responses, messages), x-compaction-status, the
tokens as sent and as forwarded (None when it went out uncounted, far below the trigger), the
bytes as sent and as forwarded, the compaction id, the upstream's status, the proxy's own time
before forwarding (ms), the recall rounds the proxy answered and the tokens they cost. A plain
tuple: a request pays for it, not for a document; `AdminRecords.timeline` makes the documents
when the dashboard asks (a named tuple cost a microsecond more per request)."""

TIMELINE_FIELDS = (
    "time", "dialect", "status", "tokens_before", "tokens_after", "bytes_before", "bytes_after",
    "compaction_id", "upstream_status", "overhead_ms", "recall_rounds", "recall_tokens",
)  # fmt: skip
"""The fields of a TimelineLine, as the dashboard's timeline documents name them."""


class AdminRecords(Protocol):
    """The records the app keeps per session, as proxy.http uses them: a forwarded request is
    counted and put in its session's timeline, /admin lists the sessions and shows one, the
    dashboard pages through them."""

    def touch(self, session_id: str) -> None: ...

    def list(self) -> dict[str, Any]: ...

    def get(self, session_id: str) -> dict[str, Any] | None: ...

    def add_request(self, session_id: str, line: TimelineLine) -> None:
        """A hooked request's line in its session's timeline (proxy.http.forwarding)."""
        ...

    def page(
        self,
        *,
        sort: str = "last_seen",
        descending: bool = True,
        search: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """One page of session summaries for the dashboard, ordered by a SORTABLE field."""
        ...

    def timeline(self, session_id: str) -> Sequence[dict[str, Any]] | None: ...

    def overhead_quantiles(self) -> dict[str, float | None]: ...


SORTABLE = frozenset(
    {
        "session_id", "last_seen", "first_seen", "requests", "records_total", "dialect",
        "model", "tokens_sent", "tokens_forwarded", "tokens_saved", "summarizer_calls",
        "summarizer_failures",
    }
)  # fmt: skip
"""The session summary fields a page of sessions may be ordered by (/admin/api/sessions)."""


def check_session_id(value: str, source: str) -> str:
    """`value` if it is a valid id; SessionIdRefused (400) naming `source` otherwise."""
    if not is_valid_session_id(value):
        raise SessionIdRefused(
            f"invalid session id in {source}: use 1-128 characters from [A-Za-z0-9._-], "
            "not starting with a dot"
        )
    return value


def resolve_session_id(headers: Mapping[str, str], path_session: str | None) -> str | None:
    """The explicit session id of a request (header first, then path), validated; None if the
    request names none. Both are checked when both are present: a bad id is a bad request."""
    header = headers.get(SESSION_HEADER)
    if path_session is not None:
        check_session_id(path_session, "the path")
    if header is not None:
        return check_session_id(header, f"the {SESSION_HEADER} header")
    return path_session
