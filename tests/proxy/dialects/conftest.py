"""The compacting tests' fixtures (a scripted upstream, a proxy with a small window), for the
dialects replayed through the real proxy."""

from __future__ import annotations

from tests.proxy.compacting.conftest import script, start

__all__ = ["script", "start"]
