"""The archive of folded turns: what a compaction folds, kept verbatim per session and per caller
credential, and searched (best matches first) with the session's memory items.

- entries: what is archived (`Entry`), what a search finds (`Found`), the `Archive` role every
  backend plays, and the scope a session's turns are kept under;
- terms: the words of a query, the simple term score (backends without a full-text index,
  the memory file) and a text's signature (the Redis word index);
- local: the process only (`state.backend: memory`);
- sqlite: tables of the state file, with an FTS5 index (a LIKE scan where SQLite lacks FTS5),
  through the file's one connection (proxy.state.sqlite_file);
- redis: shared by replicas, with a word index of a signature per turn, through the process's
  one client (proxy.state.redis_client);
- memory_file: the session's memory items (`{memory.dir}/{session}/compaction_flush.jsonl`);
- search: one search over both.

A backend is chosen, beside the checkpoint store over the same file or client, in
proxy.state.factory. Bounds: per scope (`archive.max_mb_per_session`), by age, and over all
scopes (`archive.max_total_mb`: the least recently archived scope dropped whole, its index with
it); what one turn weighs against them is its backend's `Archive.weight` (`Entry.size`, what it
is stored in, and what its index takes there).

Writing at each compaction is proxy.compacting.background.archiving; it never blocks or fails a
request.
"""

from __future__ import annotations

from proxy.state.archive.entries import Archive, Entry, Found, Kind, Scope
from proxy.state.archive.search import search_session

__all__ = ["Archive", "Entry", "Found", "Kind", "Scope", "search_session"]
