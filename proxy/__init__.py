"""proxy: the HTTP layer of compaction-proxy (routing, sessions, forwarding, streaming, metrics)."""
