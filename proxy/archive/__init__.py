"""The archive of folded turns: what a compaction folds, kept verbatim per session and per caller
credential, and searched (best matches first) with the session's memory items.

- entries: what is archived (`Entry`), what a search finds (`Found`), the `Archive` role every
  backend plays, and the scope a session's turns are kept under;
- terms: the words of a query and the simple term score (backends without a full-text index,
  the memory file);
- local: the process only (`state.backend: memory`);
- sqlite: the state file, with an FTS5 index (a LIKE scan where SQLite lacks FTS5);
- redis: shared by replicas, with an inverted index per scope;
- memory_file: the session's memory items (`{memory.dir}/{session}/compaction_flush.jsonl`);
- search: one search over both, and `build_archive`, the one place a backend is chosen.

Writing at each compaction is proxy.compacting.archiving; it never blocks or fails a request.
"""

from __future__ import annotations

from proxy.archive.entries import Archive, Entry, Found, Kind, Scope
from proxy.archive.search import build_archive, search_session

__all__ = ["Archive", "Entry", "Found", "Kind", "Scope", "build_archive", "search_session"]
