"""Settings: the pydantic model of config.yaml and the one way to load it.

Precedence, lowest first: built-in defaults, the YAML file, `COMPACTION_PROXY__SECTION__KEY`
environment variables, CLI overrides. Every problem becomes one `SettingsError`: one line naming
the dotted key and the reason; the CLI prints it and exits 2. `create_app()` takes a `Settings`
and never reads a file or the environment itself (but for `upstream.trust_env`'s proxies).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Self
from urllib.parse import parse_qsl, urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from compaction import CompactionSettings, Strategy, Trigger

_LIBRARY = CompactionSettings()
"""The library's defaults, which this section's defaults are."""

ENV_PREFIX = "COMPACTION_PROXY__"


class SettingsError(Exception):
    """A configuration problem; `str()` is one line naming the key and the reason."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_mb: float = Field(default=64, gt=0)
    read_timeout_s: float = Field(default=60, gt=0)
    shutdown_timeout_s: float = Field(default=30, gt=0)
    heap_trim_s: float = Field(default=30, ge=0)
    """How often the C allocator's free memory is given back to the system (proxy.heap); 0:
    never."""

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)


class UpstreamSettings(_Section):
    base_url: str = "https://api.openai.com/v1"
    anthropic_base_url: str = "https://api.anthropic.com/v1"
    """Where /v1/messages and everything under it goes (Anthropic's Messages API)."""
    timeout_s: float = Field(default=600, gt=0)
    connect_timeout_s: float = Field(default=10, gt=0)
    api_key: str | None = None
    trust_env: bool = False  # HTTPS_PROXY / HTTP_PROXY / NO_PROXY, read at start (http.egress)
    websocket: Literal["refuse", "relay"] = "refuse"
    """A WebSocket upgrade: answered 426 (the client falls back to HTTP POST), or relayed
    untouched (proxy.http.websocket)."""

    @field_validator("base_url", "anthropic_base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("must not carry a query, a fragment or credentials")
        return value.rstrip("/")


class Price(_Section):
    """A model's list price in currency units per million tokens (the dashboard's savings)."""

    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)


PRESERVED_THINKING = (
    "claude-fable-5*",
    "claude-mythos-5*",
    "claude-opus-5-5*",
    "claude-sonnet-5-5*",
    "claude-haiku-5-5*",
)
"""The models Anthropic documents as running the prefix check on thinking blocks (platform docs
`build-with-claude/preserved-thinking`)."""


class ModelsSettings(_Section):
    default_context_window: int = Field(default=128000, gt=0)
    context_windows: dict[str, PositiveInt] = Field(default_factory=dict)
    discover: bool = True  # read unconfigured models' windows from the upstream
    discover_timeout_s: float = Field(default=1.0, gt=0)  # the longest a request waits for it
    max_models: int = Field(default=1024, gt=0)
    """Models whose calibration factor and learned window are kept (least recently used go)."""
    prices: dict[str, Price] = Field(default_factory=dict)
    # A mid-range hosted model's list price: savings are an estimate until `prices` says more.
    default_price: Price = Price(input=2.5, cached_input=1.25, output=10.0)
    preserved_thinking: list[str] = Field(default_factory=lambda: list(PRESERVED_THINKING))
    """Models (exact names or globs) whose thinking blocks are bound to their prefix: a
    compacted request sends back none whose prefix changed (proxy.compacting.decision.thinking)."""

    def has_preserved_thinking(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.preserved_thinking)

    def price_for(self, model: str | None) -> Price:
        """The price of `model`: exact name first, then the first matching glob, then the
        default."""
        if model is None:
            return self.default_price
        if model in self.prices:
            return self.prices[model]
        for pattern, price in self.prices.items():
            if fnmatch.fnmatchcase(model, pattern):
                return price
        return self.default_price

    def context_window_for(self, model: str) -> int:
        """The context window of `model`: configured (configured_window), else the default."""
        configured = self.configured_window(model)
        return self.default_context_window if configured is None else configured

    def configured_window(self, model: str) -> int | None:
        """The window configured for `model`: exact name first, then the first matching glob."""
        if model in self.context_windows:
            return self.context_windows[model]
        for pattern, window in self.context_windows.items():
            if fnmatch.fnmatchcase(model, pattern):
                return window
        return None


class CompactionSection(_Section):
    """The `compaction:` section: the library's settings (compaction.CompactionSettings, the
    library's class, holds each default) plus the proxy's own (precompute, timeouts, cooldown)."""

    enabled: bool = True
    mode: Literal["on", "shadow"] = "on"
    """shadow: compute, record and show every compaction as `on` would, and forward the
    client's original bytes untouched."""
    trigger_ratio: float = Field(default=_LIBRARY.trigger_ratio, gt=0, le=1)
    trigger_tokens: int | None = Field(default=_LIBRARY.trigger_tokens, gt=0)
    """Or at this many tokens, whichever comes first (compaction.Trigger: the other ratios then
    follow it, as on the window whose `trigger_ratio` it is)."""
    target_ratio: float = Field(default=_LIBRARY.target_ratio, gt=0, le=1)
    precompute_ratio: float = Field(default=0.7, ge=0, le=1)
    fit_ratio: float | None = Field(default=0.95, gt=0, le=1)
    """Past the trigger a compaction starts; until it is ready, a request goes out as it is
    while it still fits: under this share of the window, its `max_tokens` within the window.
    None: a request over the trigger waits for its compaction (the trigger is also the fit)."""
    keep_recent_rounds: int = Field(default=_LIBRARY.keep_recent_rounds, gt=0)
    summary_model: str | None = None
    summary_request: Literal["cached", "standalone"] = "cached"
    """cached: the summary (and memory items) asked as a final turn after the conversation's
    own request, which the provider's prompt cache already holds; standalone: the folded
    transcript sent in a request of its own (always, with another summary_model)."""
    summary_max_tokens: int = Field(default=_LIBRARY.summary_max_tokens, gt=0)
    summarizer: Literal["text", "native"] = "text"
    """text: the proxy's own summary message (the model's text, the pinned instructions, code's
    sections); native: on Anthropic's Messages API, Anthropic's on-demand compaction block over
    the folded turns (proxy.dialects.anthropic.native), which keeps the kept turns' thinking
    readable, with no pinned section, and no `recall` tool on any Anthropic request while it is
    set (`tools` never changes); the text summary where the API has none or the call fails
    (docs/dialects.md)."""
    summary_timeout_s: float = Field(default=60, gt=0)
    failure_threshold: int = Field(default=3, gt=0)
    failure_cooldown_s: float = Field(default=300, ge=0)
    checkpoint_max_entries: int = Field(default=10000, gt=0)
    checkpoint_ttl_s: float = Field(default=21600, gt=0)
    known_requests_mb: float = Field(default=256, ge=0)
    scanned_texts_mb: float = Field(default=96, gt=0)
    """Texts already scanned for facts kept per worker process (and in the proxy with `workers`
    0), so a fold redone over a longer history scans only what is new (MiB, at ~3 bytes a
    character: the text and what was found in it); the least recently used go first."""
    known_requests: int = Field(default=256, gt=0)
    """Long conversations whose last body is remembered (with at most `known_requests_mb` of
    them), the least recently seen forgotten first: one forgotten is parsed whole once."""
    workers: int = Field(default=1, ge=0)
    worker_timeout_s: float = Field(default=60, gt=0)
    strict_alternation: bool = _LIBRARY.strict_alternation
    pinned_ratio: float = Field(default=_LIBRARY.pinned_ratio, ge=0, lt=1)
    strategy: Strategy = _LIBRARY.strategy
    recall: Literal["on", "off"] = "on"
    """on: a compacted request carries the `recall` tool (proxy.recall), answered by the proxy
    from the session's archive and memory items; off: compacted requests as without recall."""
    recall_max_rounds: int = Field(default=3, ge=0, le=20)
    """Upstream calls answered with a recall per client request at most (0: like `off`)."""

    @field_validator("mode", "recall", mode="before")
    @classmethod
    def _on_is_a_word(cls, value: object) -> object:
        # YAML 1.1 reads a bare `on` as true, a bare `off` as false.
        if value is True:
            return "on"
        return "off" if value is False else value

    @field_validator("target_ratio")
    @classmethod
    def _target_below_trigger(cls, value: float, info: ValidationInfo) -> float:
        trigger = info.data.get("trigger_ratio")
        if trigger is not None and value >= trigger:
            raise ValueError(f"must be below compaction.trigger_ratio ({trigger})")
        return value

    @field_validator("precompute_ratio")
    @classmethod
    def _precompute_up_to_trigger(cls, value: float, info: ValidationInfo) -> float:
        trigger = info.data.get("trigger_ratio")
        if trigger is not None and value > trigger:
            raise ValueError(f"must not exceed compaction.trigger_ratio ({trigger})")
        return value

    @field_validator("fit_ratio")
    @classmethod
    def _fit_from_trigger(cls, value: float | None, info: ValidationInfo) -> float | None:
        trigger = info.data.get("trigger_ratio")
        if value is not None and trigger is not None and value < trigger:
            raise ValueError(f"must not be below compaction.trigger_ratio ({trigger}), or null")
        return value

    @property
    def trigger(self) -> Trigger:
        """The one trigger rule, with this section's ratio and absolute trigger."""
        return Trigger(self.trigger_ratio, self.trigger_tokens)

    @property
    def scanned_chars(self) -> int:
        return int(self.scanned_texts_mb * 1024 * 1024) // 3

    def library_settings(self, *, llm_timeout_s: float) -> CompactionSettings:
        return CompactionSettings(
            trigger_ratio=self.trigger_ratio,
            trigger_tokens=self.trigger_tokens,
            target_ratio=self.target_ratio,
            keep_recent_rounds=self.keep_recent_rounds,
            summary_max_tokens=self.summary_max_tokens,
            llm_timeout_s=llm_timeout_s,
            strict_alternation=self.strict_alternation,
            pinned_ratio=self.pinned_ratio,
            strategy=self.strategy,
        )


class MemorySettings(_Section):
    dir: Path = Path("./workspace/memory")
    max_sessions: int = Field(default=512, gt=0)
    """Sessions whose memory-writer state (a lock, the items already written) is kept in
    process; a session forgotten is read back from its file when it writes again."""
    cached_items: int = Field(default=10000, gt=0)
    """Items already written whose keys are kept in process, over all those sessions (the least
    recently writing session's go first; a session with more is read back each time)."""


class AdminSettings(_Section):
    token: str | None = None
    records_per_session: int = Field(default=50, gt=0)
    max_sessions: int = Field(default=10000, gt=0)
    max_records_mb: float = Field(default=32, gt=0)
    """What the sessions' records and timelines may hold in memory, estimated (MiB); beyond it
    the least recently seen sessions go."""
    preview_chars: int = Field(default=400, ge=0)

    @field_validator("token")
    @classmethod
    def _token_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be null (admin disabled) or a non-empty string")
        return value


class StateSettings(_Section):
    """Where checkpoints, cooldowns and single-flight live (proxy.state)."""

    backend: Literal["memory", "sqlite", "redis"] = "sqlite"
    path: Path = Path("./workspace/state.sqlite3")
    redis_url: str | None = None
    redis_max_connections: int = Field(default=32, ge=1)
    cached_checkpoints: int = Field(default=1024, gt=0)
    """Checkpoints the sqlite and redis backends keep decoded in the process (least recently
    used go first; a checkpoint not kept is read back from the backend when needed)."""
    timeout_s: float = Field(default=0.5, gt=0)
    retry_s: float = Field(default=5, gt=0)

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        url = urlsplit(value)
        if url.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        try:
            url.port  # noqa: B018 (raises on a port that is not a number)
        except ValueError:
            raise ValueError("the port must be a number") from None
        # The database: the path of a redis:// URL, or its `db` query parameter (redis-py would
        # silently use database 0 for anything else).
        databases = [value for key, value in parse_qsl(url.query) if key == "db"]
        if url.scheme != "unix" and url.path.strip("/"):
            databases.append(url.path.strip("/"))
        if any(not database.isdigit() for database in databases):
            raise ValueError("the database must be a number, as in redis://host:6379/0")
        return value

    @model_validator(mode="after")
    def _redis_needs_url(self) -> Self:
        if self.backend == "redis" and self.redis_url is None:
            raise ValueError("redis_url is required when backend is redis")
        return self


class ArchiveSettings(_Section):
    """Folded turns kept verbatim per session and credential, for recall (proxy.state.archive)."""

    enabled: bool = True
    max_mb_per_session: float = Field(default=64, gt=0)
    max_total_mb: float = Field(default=1024, gt=0)
    """Every session's archive together, in the state file or in Redis, its index included
    (MiB); beyond it the least recently archived session goes whole."""
    memory_max_mb: float = Field(default=256, gt=0)
    """With `state.backend: memory` (the archive in the process): every session's folded turns
    together (MiB); beyond it the least recently archived session goes first."""
    max_age_days: float = Field(default=30, gt=0)
    search_limit: int = Field(default=10, gt=0, le=1000)

    @property
    def max_bytes_per_session(self) -> int:
        return int(self.max_mb_per_session * 1024 * 1024)

    @property
    def max_total_bytes(self) -> int:
        return int(self.max_total_mb * 1024 * 1024)

    @property
    def memory_max_bytes(self) -> int:
        """The archive in the process: the lower of `memory_max_mb` and `max_total_mb`."""
        return int(min(self.memory_max_mb, self.max_total_mb) * 1024 * 1024)

    @property
    def max_age_s(self) -> float:
        return self.max_age_days * 86400


class LoggingSettings(_Section):
    level: str = "INFO"
    dump_dir: Path | None = None
    """Where compacted requests are dumped as received and as compacted
    (proxy.compacting.background.dumps); None: no dump."""
    dump_max_files: int = Field(default=300, gt=0)
    dump_max_mb: float = Field(default=256, gt=0)

    @field_validator("level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level


class Settings(_Section):
    server: ServerSettings = Field(default_factory=ServerSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    compaction: CompactionSection = Field(default_factory=CompactionSection)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @classmethod
    def build(cls, data: Mapping[str, object]) -> Self:
        """Validate a nested mapping, turning pydantic's report into one `SettingsError` line."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SettingsError(_one_line(exc)) from None


def load_settings(
    config_path: str | None,
    environ: Mapping[str, str],
    overrides: Mapping[str, Mapping[str, object]] | None = None,
) -> Settings:
    """File, then environment, then CLI overrides (each `{section: {key: value}}`)."""
    data: dict[str, object] = _read_file(config_path) if config_path else {}
    _merge(data, _read_environ(environ))
    _merge(data, overrides or {})
    return Settings.build(data)


def _read_file(path: str) -> dict[str, object]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"config {path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise SettingsError(f"config {path}: not valid YAML{line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config {path}: the top level must be a mapping of sections")
    for section, value in data.items():
        if value is not None and not isinstance(value, dict):
            raise SettingsError(f"{section}: must be a mapping of keys")
    return {str(k): dict(v or {}) for k, v in data.items()}


def _read_environ(environ: Mapping[str, str]) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) != 2 or not all(parts):
            raise SettingsError(f"{name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
        section, key = parts
        found.setdefault(section, {})[key] = _parse_env_value(section, key, raw, name)
    return found


def _parse_env_value(section: str, key: str, raw: str, name: str) -> object:
    """A YAML scalar, except that string-typed keys keep the raw text (an all-digit token stays
    a string); `null` or `~` still means None."""
    if raw.strip() in ("null", "~", "Null", "NULL"):
        return None
    if _is_string_key(section, key):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        raise SettingsError(f"{section}.{key}: not a valid YAML value (from {name})") from None


def _is_string_key(section: str, key: str) -> bool:
    section_field = Settings.model_fields.get(section)
    if section_field is None or not isinstance(section_field.annotation, type):
        return False
    model = section_field.annotation
    if not issubclass(model, BaseModel):
        return False
    key_field = model.model_fields.get(key)
    return key_field is not None and key_field.annotation in (str, str | None)


def _merge(into: dict[str, object], layer: Mapping[str, object]) -> None:
    for section, values in layer.items():
        if isinstance(values, Mapping) and isinstance(current := into.get(section), dict):
            current.update(values)
        else:
            into[section] = dict(values) if isinstance(values, Mapping) else values


def _one_line(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "settings"
        reason = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            reason = "unknown key"
        problems.append(f"{key}: {reason}")
    return "; ".join(problems).replace("\n", " ")
