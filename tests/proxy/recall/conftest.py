"""The compaction fixtures (a scripted upstream, a proxy with a small window) with recall on, as
by default."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.proxy.compacting.conftest import script, small_window_proxies
from tests.proxy.conftest import RunningProxy, StartProxy

__all__ = ["script", "start"]


@pytest.fixture
def start(start_proxy: StartProxy, tmp_path: Path) -> Callable[..., Awaitable[RunningProxy]]:
    return small_window_proxies(start_proxy, tmp_path, recall="on")
