"""The compaction fixtures (a scripted upstream, a proxy with a small window) for recall tests."""

from __future__ import annotations

from tests.proxy.compacting.conftest import script, start

__all__ = ["script", "start"]
