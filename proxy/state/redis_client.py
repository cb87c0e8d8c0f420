"""The process's one Redis client (`state.redis_url`): one bounded pool that every consumer of
Redis shares (the checkpoint store, proxy.state.redis, with its notices; the archive,
proxy.state.archive.redis), and the words for what keeps the process from using it.

Calls are bounded by `state.timeout_s`: past the pool's size a call waits for a free connection
that long at most, and a pooled connection the server closed is reopened at once; anything
longer is the guard's business (proxy.state.guard), which leaves a failing Redis alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class Unreachable(ConnectionError):
    """What keeps this process from using Redis, in words (no credentials)."""


class RedisClient:
    def __init__(self, url: str, *, timeout_s: float, max_connections: int) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._client: aioredis.Redis | None = None
        self._users = 0

    def attach(self) -> None:
        """One more consumer, which closes the client once (the last to close it closes it)."""
        self._users += 1

    def get(self) -> aioredis.Redis:
        """The client, built on first use (building it connects nothing)."""
        if self._client is None:
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url,
                max_connections=self._max_connections,
                timeout=self._timeout_s,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
                # One immediate retry (a pooled connection the server closed is reopened at
                # once); anything longer is the guard's business.
                retry=Retry(NoBackoff(), 1),
            )
            self._client = aioredis.Redis.from_pool(pool)
        return self._client

    async def check(self) -> None:
        """Say what keeps this process from using Redis (raising Unreachable: the guard logs
        it once and serves in-process); the client stays, to be retried later."""
        client = self.get()
        options = client.connection_pool.connection_kwargs
        where = _where(options)
        try:
            await client.ping()
        except AuthenticationError as exc:
            raise Unreachable(f"Redis at {where} refused the login (state.redis_url)") from exc
        except NoPermissionError as exc:
            raise Unreachable(f"Redis at {where} does not let this user in") from exc
        except ResponseError as exc:
            # The connection's only other command is SELECT of the URL's database.
            database = options.get("db", 0)
            raise Unreachable(f"Redis at {where} has no database {database}") from exc
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise Unreachable(f"Redis at {where} cannot be reached: {exc}") from exc

    async def close(self) -> None:
        """One consumer is done: the last one closes the client."""
        self._users = max(0, self._users - 1)
        if self._users or self._client is None:
            return
        client, self._client = self._client, None
        await client.aclose()


def _where(options: Mapping[str, object]) -> str:
    """Host and port, or the socket path, of a pool's connections: never the credentials."""
    if "path" in options:
        return str(options["path"])
    return f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"
