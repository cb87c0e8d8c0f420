"""Deciding per request and per conversation, behind one door: the hook (`hook.CompactingHook`)
that proxy.http calls through proxy.interception builds and wires the rest.

- `decision/`: what one request goes out with and when a conversation's compaction starts: the
  request as parsed, its history, the conversations (`Conversations.decide`, the one decision),
  the exchange and its one retry, the fallback, preparing ahead, the records;
- `background/`: work that runs beside the requests and never holds one up: the worker
  processes, single-flight, the archive and memory-file writes, the debug dumps;
- `models/`: what the proxy asks of and learns about the upstream's models: their windows
  (configured, discovered, learned from an overflow), the estimate's calibration, the
  summarizer's client;
- `fast/`: the speed machinery, entered through its package only.

The arrows go one way, in this order: the hook, fast/, decision/, then background/ and models/;
each imports only what comes after it (background/ reads a request's type from decision/ under
TYPE_CHECKING only, which never runs).
"""
