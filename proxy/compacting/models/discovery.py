"""Context windows read from the upstream, for models the configuration does not name
(`models.discover`): local servers publish them, so nobody has to type them.

Where each server says it, asked in this order:
- the OpenAI-style listing `GET {base_url}/models`: vLLM's `max_model_len`, llama.cpp server's
  `meta.n_ctx_train` (its running `n_ctx` at `GET /props` wins when it answers), LM Studio's and
  gateways' `context_length` / `max_context_length`;
- Ollama: `POST {root}/api/show` with the model, its `model_info["<arch>.context_length"]`
  (a `num_ctx` in its parameters wins);
- LM Studio: `GET {root}/api/v0/models/{model}`, `loaded_context_length` or
  `max_context_length`.

It is on by default, so it must cost next to nothing where nothing is published (OpenAI, a
gateway): each model is looked up once per upstream (one WindowDiscovery per upstream) and
remembered, found or not; a place that fails or answers anything but 200 (a 404 listing, an
upstream that is not Ollama) is remembered too and never asked again, for any model. A request
waits for its model's lookup at most `wait_s` (concurrent first requests wait for the same
lookup); a slower lookup goes on in the background and serves the requests after it, the
configured default applying meanwhile. Nothing here is an upstream error: a failed lookup is
logged at debug level and counted nowhere. `source` says where a window came from, for the
compaction records.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import aiohttp
import orjson
from cachetools import LRUCache
from yarl import URL

log = logging.getLogger(__name__)

_MIN_WINDOW = 256  # a smaller figure is not a context window
_NUM_CTX = re.compile(r"(?m)^num_ctx\s+(\d+)")


@dataclass(frozen=True)
class Window:
    tokens: int
    source: str
    """Where it came from: "configured", "default", or the discovering call."""


class _Absent(Exception):
    """The place asked does not publish windows here (it failed or did not answer 200)."""


class WindowDiscovery:
    """The windows of unconfigured models, asked of the upstream at `base_url` with `session`."""

    def __init__(
        self,
        session: Callable[[], aiohttp.ClientSession],
        base_url: str,
        timeout_s: float,
        wait_s: float,
        spawn: Callable[[Coroutine[Any, Any, Window | None], str], asyncio.Task[Window | None]],
        max_models: int = 1024,
    ) -> None:
        """`session`: the app's ClientSession, once it is open; `timeout_s` bounds each call,
        `wait_s` how long a request waits for its model's lookup; `spawn(coro, name)` runs the
        lookup as a background task the app owns (BackgroundTasks.spawn); `max_models`
        (models.max_models) models' answers are kept, the least recently asked go first (a
        client names any model it likes: one entry each, kept for ever, was a leak)."""
        self._session = session
        self._base = URL(base_url.rstrip("/"))
        self._root = self._base.parent if self._base.path.endswith("/v1") else self._base
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._wait_s = wait_s
        self._spawn = spawn
        self._found: LRUCache[str, Window | None] = LRUCache(max_models)
        self._pending: dict[str, asyncio.Task[Window | None]] = {}
        self._absent: set[str] = set()

    def known(self, model: str) -> Window | None:
        """The discovered window of `model`, if it was looked up and found."""
        return self._found.get(model)

    def smallest(self) -> int | None:
        windows = [w.tokens for w in self._found.values() if w is not None]
        return min(windows) if windows else None

    async def discover(self, model: str, headers: Mapping[str, str]) -> Window | None:
        """The window of `model` as the upstream publishes it (None: it does not, or not yet),
        looked up once with the caller's credentials `headers`; concurrent callers wait for
        that one lookup, none longer than `wait_s`."""
        if model in self._found:
            return self._found[model]  # (and now the most recently asked)
        lookup = self._pending.get(model)
        if lookup is None:
            lookup = self._spawn(self._look_up(model, headers), f"window discovery: {model}")
            self._pending[model] = lookup
            lookup.add_done_callback(lambda done: self._settle(model, done))
        try:
            return await asyncio.wait_for(asyncio.shield(lookup), self._wait_s)
        except TimeoutError:
            log.debug("window discovery of %s goes on in the background", model)
            return None

    def _settle(self, model: str, lookup: asyncio.Task[Window | None]) -> None:
        self._pending.pop(model, None)
        failed = lookup.cancelled() or lookup.exception() is not None
        self._found[model] = None if failed else lookup.result()

    async def _look_up(self, model: str, headers: Mapping[str, str]) -> Window | None:
        for source, ask in (
            ("GET /v1/models", self._from_listing),
            ("POST /api/show (Ollama)", self._from_ollama),
            ("GET /api/v0/models (LM Studio)", self._from_lm_studio),
        ):
            if source in self._absent:
                continue
            try:
                tokens = await ask(model, headers)
            except (_Absent, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.debug("window discovery: %s failed, not asked again: %r", source, exc)
                self._absent.add(source)
                continue
            if tokens is not None and tokens >= _MIN_WINDOW:
                log.info("window of %s discovered: %d (%s)", model, tokens, source)
                return Window(tokens, f"discovered: {source}")
        log.info("window of %s not published by the upstream; the default applies", model)
        return None

    async def _get(self, url: URL, headers: Mapping[str, str], body: Any = None) -> Any:
        method = "GET" if body is None else "POST"
        data = None if body is None else orjson.dumps(body)
        sent = {**headers, "Content-Type": "application/json"} if data else dict(headers)
        async with self._session().request(
            method, url, data=data, headers=sent, timeout=self._timeout, allow_redirects=False
        ) as response:
            if response.status != 200:
                raise _Absent(f"{method} {url.path}: {response.status}")
            return orjson.loads(await response.read())

    async def _from_listing(self, model: str, headers: Mapping[str, str]) -> int | None:
        listing = await self._get(self._base / "models", headers)
        entries = listing.get("data") if isinstance(listing, dict) else None
        entry = next(
            (e for e in entries or [] if isinstance(e, dict) and e.get("id") == model), None
        )
        if entry is None:
            return None
        for value in (
            entry.get("max_model_len"),
            entry.get("context_length"),
            entry.get("max_context_length"),
        ):
            if _is_count(value):
                return int(value)
        meta = entry.get("meta")
        trained = meta.get("n_ctx_train") if isinstance(meta, dict) else None
        if not _is_count(trained):
            return None
        # llama.cpp server: the context it runs with, when /props says, else its training's.
        try:
            props = await self._get(self._root / "props", headers)
        except (_Absent, aiohttp.ClientError, TimeoutError, ValueError):
            props = None
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        running = settings.get("n_ctx") if isinstance(settings, dict) else None
        return int(running) if _is_count(running) else int(trained)

    async def _from_ollama(self, model: str, headers: Mapping[str, str]) -> int | None:
        shown = await self._get(self._root / "api" / "show", headers, {"model": model})
        if not isinstance(shown, dict):
            return None
        parameters = shown.get("parameters")
        if isinstance(parameters, str) and (num_ctx := _NUM_CTX.search(parameters)):
            return int(num_ctx.group(1))
        info = shown.get("model_info")
        if isinstance(info, dict):
            for key, value in info.items():
                if key.endswith(".context_length") and _is_count(value):
                    return int(value)
        return None

    async def _from_lm_studio(self, model: str, headers: Mapping[str, str]) -> int | None:
        entry = await self._get(self._root / "api" / "v0" / "models" / model, headers)
        if not isinstance(entry, dict):
            return None
        for key in ("loaded_context_length", "max_context_length"):
            if _is_count(entry.get(key)):
                return int(entry[key])
        return None


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
