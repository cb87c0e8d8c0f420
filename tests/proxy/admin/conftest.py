"""The compaction fixtures (a scripted upstream, a proxy with a small window and an admin token)
for what admin shows of a proxy that compacted."""

from __future__ import annotations

from tests.proxy.compacting.conftest import script, start

__all__ = ["script", "start"]
