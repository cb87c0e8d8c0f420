"""What the archive keeps and finds, and the role each backend plays.

A folded message is kept as the JSON the client sent (verbatim), with its index in the
conversation, its dialect, its kind and when it was archived, under a `Scope`: the session and
a digest of the caller's credentials and of the conversation, so that nothing of one credential,
session or conversation is found from another.

A turn is stored once: its JSON and its text compressed together (`pack`; the text repeats
what the JSON says, so it costs next to nothing beside it: both together weigh about a fifth of
the two as they were). What one turn weighs against the bounds is its backend's `weight`:
`Entry.size` and what its index takes.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Kind = Literal["message", "tool_output", "memory"]
"""message: what the user or the model wrote; tool_output: a tool's result; memory: an item of the
session's memory file (searched beside the archive, never stored in it)."""


@dataclass(frozen=True, slots=True)
class Scope:
    session: str
    tenant: str
    """A digest of the caller's credentials and of the conversation's opening
    (proxy.compacting.decision.request.ParsedRequest.conversation): one session id reused by two
    conversations keeps two archives."""


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    """Its position in the conversation's list (chat `messages`, Responses `input`...)."""
    dialect: str
    kind: Kind
    compaction_id: str
    at: float
    """When it was archived (seconds since the epoch)."""
    text: str
    """What a search reads: its prose, its calls' names and arguments."""
    packed: bytes
    """The message as the client sent it (JSON) and its text, compressed together (`pack`)."""

    @classmethod
    def of(
        cls, index: int, dialect: str, kind: Kind, compaction_id: str, at: float, body: str,
        text: str,
    ) -> Entry:  # fmt: skip
        """The entry of `body`, the message's JSON (compressed here: off the event loop)."""
        return cls(index, dialect, kind, compaction_id, at, text, pack(body, text))

    @property
    def body(self) -> str:
        """The message as the client sent it (JSON)."""
        return unpack(self.packed)[0]

    @property
    def size(self) -> int:
        """The bytes it is stored in."""
        return len(self.packed)

    def found(self, score: float) -> Found:
        return Found(
            self.kind, self.index, score, self.text, self.body, self.compaction_id, self.at
        )


@dataclass(frozen=True, slots=True)
class Found:
    kind: Kind
    index: int | None
    """The turn it came from (None for a memory item)."""
    score: float
    """Higher is better; comparable within one search."""
    text: str
    body: str | None
    """The archived message (None for a memory item)."""
    compaction_id: str
    at: float

    def describe(self) -> dict[str, object]:
        """The JSON an admin or a command-line reader sees."""
        return {
            "kind": self.kind,
            "index": self.index,
            "score": round(self.score, 4),
            "compaction_id": self.compaction_id,
            "at": self.at,
            "text": self.text,
            "message": self.body,
        }


class Archive(Protocol):
    """Every backend (local, sqlite, redis). `tenant=None` in a search: every credential's turns
    of the session (an operator's view: the admin route, the command line)."""

    name: str

    def weight(self, entry: Entry) -> int:
        """What `entry` weighs against the bounds: `Entry.size` and what its index takes."""
        ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        """Keep `entries` (an index already kept for the scope is kept once) and apply the
        bounds: how many were dropped, by reason (`size`: the scope's bound, `age`, `total`: all
        scopes' bound, the least recently archived going whole)."""
        ...

    async def search(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> list[Found]:
        """Best matches first, at most `limit`."""
        ...

    async def find(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> tuple[list[Found], set[str] | None]:
        """`search`, and for a credential (`tenant`) its `compactions` too (None for the whole
        session), in one trip to the backend where it can: what a recall round waits for."""
        ...

    async def compactions(self, session: str, *, tenant: str | None) -> set[str]:
        """The compactions whose turns are archived for the session (and credential): scopes the
        memory items a search returns."""
        ...


async def find_in_two_trips(
    archive: Archive, session: str, query: str, *, tenant: str | None, limit: int
) -> tuple[list[Found], set[str] | None]:
    """`Archive.find` for a backend that cannot answer both in one trip: its `search`, then
    for a credential its `compactions`."""
    found = await archive.search(session, query, tenant=tenant, limit=limit)
    if tenant is None:
        return found, None
    return found, await archive.compactions(session, tenant=tenant)


def pack(body: str, text: str) -> bytes:
    """A message's JSON and text as stored: compressed together (zlib), the JSON first (it holds
    no NUL: JSON escapes control characters), then a NUL, then the text."""
    return zlib.compress(body.encode() + b"\x00" + text.encode())


def unpack(packed: bytes) -> tuple[str, str]:
    """The JSON and the text `pack` stored."""
    body, _, text = zlib.decompress(packed).partition(b"\x00")
    return body.decode(), text.decode()


def text_bytes(text: str) -> int:
    """The length of `text` in UTF-8 (without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode())
