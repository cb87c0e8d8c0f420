"""The `state:` section: defaults, the Redis URL a redis backend needs, the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.settings import Settings, SettingsError, load_settings


def test_sqlite_in_the_workspace_is_the_default() -> None:
    state = Settings.build({}).state
    assert state.backend == "sqlite"
    assert state.path == Path("workspace/state.sqlite3")
    assert state.redis_url is None
    assert state.redis_max_connections == 32


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"backend": "redis"}, "state: redis_url is required when backend is redis"),
        ({"backend": "redis", "redis_url": "http://x"}, "state.redis_url: must be a redis://"),
        (
            {"backend": "redis", "redis_url": "redis://127.0.0.1:6379/abc"},
            "state.redis_url: the database must be a number",
        ),
        (
            {"backend": "redis", "redis_url": "redis://127.0.0.1:port/0"},
            "state.redis_url: the port must be a number",
        ),
        ({"redis_max_connections": 0}, "state.redis_max_connections: Input should be greater"),
        ({"backend": "disk"}, "state.backend: Input should be 'memory', 'sqlite' or 'redis'"),
        ({"timeout_s": 0}, "state.timeout_s: Input should be greater than 0"),
    ],
)
def test_bad_state_settings_name_the_key(state: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace(".", r"\.").replace("'", ".")):
        Settings.build({"state": state})


def test_the_backend_can_be_chosen_from_the_environment() -> None:
    environ = {
        "COMPACTION_PROXY__STATE__BACKEND": "redis",
        "COMPACTION_PROXY__STATE__REDIS_URL": "redis://127.0.0.1:6379/0",
    }
    state = load_settings(None, environ).state
    assert (state.backend, state.redis_url) == ("redis", "redis://127.0.0.1:6379/0")
