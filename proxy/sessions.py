"""Sessions: who a request belongs to (docs/operations.md, "Sessions"; README.md).

Identity: `X-Session-Id`, then the `/s/{session}/` path, then (decided by the hook, which parses
the body; proxy.compacting.decision.identity) the session the client names in its body, then a
fingerprint of the conversation's opening.

Ids become directory names under `memory.dir`, so they are validated strictly here, by the
library's one rule (`compaction.is_valid_session_id`): the pattern leaves no room for
separators, and a leading dot is refused (no `.`, `..`, hidden dirs).
"""

from __future__ import annotations

from collections.abc import Mapping

from compaction import is_valid_session_id
from proxy.errors import SessionIdRefused

SESSION_HEADER = "X-Session-Id"


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
