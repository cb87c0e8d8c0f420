"""Which conversation a request belongs to when its client names it in the body (README
"Sessions": after the header and the path): the name its dialect reads (proxy.dialects.naming)
made a session id.

Such a name is the client's, not the operator's: it becomes an id of the session-id alphabet
scoped by the caller's credentials (two tenants naming the same session never share its records
or its memory file), and it never names a path. What a fingerprint reads of a conversation that
names none is its dialect's (`Dialect.opening`).

Cost on the request path: one hash of the name: microseconds, whatever the size of the body.
"""

from __future__ import annotations

import hashlib
import re

_OUT_OF_ALPHABET = re.compile(r"[^A-Za-z0-9._-]+")
_NAME_CHARS = 96  # leaves room for the scope digest within the 128 of a session id


def named_session(name: str | None, tenant: bytes) -> str | None:
    """The session id for the conversation the client names `name`, scoped by `tenant` (the
    digest of the caller's credentials); None when the client names none."""
    if name is None:
        return None
    digest = hashlib.sha256(tenant + b"\x00" + name.encode()).hexdigest()[:16]
    readable = _OUT_OF_ALPHABET.sub("_", name).lstrip(".")[:_NAME_CHARS]
    return f"{readable}-{digest}" if readable else f"named-{digest}"
