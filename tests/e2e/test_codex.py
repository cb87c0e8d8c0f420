"""The real Codex CLI through the proxy against a strict Responses API (tests/fakes/
responses_strict.py), in the two ways people point it at a gateway: the built-in OpenAI provider
with `openai_base_url` (it opens a WebSocket first) and a custom provider (`[model_providers.*]`,
as in the README). A tap between Codex and the proxy keeps what Codex sent.

Each run (the script: tests/e2e/codex_script.py) goes through a compaction by the proxy, a
compaction by Codex itself (`model_auto_compact_token_limit` set low: with the built-in provider
a `compaction_trigger` request and then its `compaction` item; with a custom provider the local
handoff prompt) while the history Codex holds is past the proxy's trigger, then the proxy's
compaction of the conversation that holds Codex's, and a recall round. Measured:
- the strict API refused nothing;
- Codex's own compaction request reached the upstream byte-identical, past the proxy's trigger;
- the `compaction` item is in every forwarded request after it was issued, byte for byte as
  Codex sent it, also in requests the proxy folded;
- `<environment_context>` is in every forwarded request the proxy folded;
- the built-in provider tried one WebSocket, answered 426 at once, and then only POSTed.

The model's window (the fake's) is larger than the budget the proxy is given for it (a
`models.context_windows` entry below the model's), so the proxy folds at a small size while
Codex's own compaction request, which holds everything, is still accepted.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from compaction import PREVIEW_MARK, SUMMARY_MARKER
from proxy.app import create_app
from proxy.http.serving import serve_on_loopback
from proxy.settings import Settings
from tests.e2e.apis import DONE
from tests.e2e.codex_script import HANDOFF, CodexScript
from tests.e2e.conftest import WINDOWS, client_binary
from tests.e2e.tap import Exchange, Tap
from tests.e2e.test_clients import _CLIENT_TIMEOUT_S, run
from tests.fakes.responses_strict import COMPACTION_TRIGGER, Received, StrictResponses
from tests.fakes.script import body_tokens

MODEL = "gpt-e2e"
MODEL_WINDOW = 128_000
CODEX_LIMIT = WINDOWS[MODEL] * 11 // 10
"""Codex's `model_auto_compact_token_limit`: past the proxy's trigger and its fit (0.95 of the
window), so the proxy folds the conversation before Codex compacts it."""
TASK = "Run the step the model asks for each time and report when every step ran."
_COMPACTION_ITEM = re.compile(rb'\{"type":"compaction"[^{}]*\}')
_HANDOFF_PROMPT = b"You are performing a CONTEXT CHECKPOINT COMPACTION"
# Codex's config.toml for both providers: its window, its own compaction's limit, tool outputs
# kept whole (the script sizes its steps), no update check.
_SETTINGS = (
    f'model = "{MODEL}"\nmodel_auto_compact_token_limit = {CODEX_LIMIT}\n'
    f"model_context_window = {MODEL_WINDOW}\ntool_output_token_limit = {MODEL_WINDOW}\n"
    "check_for_update_on_startup = false\n"
)
_OFFLINE = "[analytics]\nenabled = false\n"
# Whatever Codex would send past loopback goes to a closed port instead of the internet.
_LOOPBACK_ONLY = {
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
}
_FLAGS = ("--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check")


@dataclass
class Run:
    api: StrictResponses
    tap: Tap
    out: str
    trigger: int
    """The proxy's trigger for the model, in tokens."""

    @property
    def sent(self) -> list[Exchange]:
        """What Codex sent through the proxy (its POSTs)."""
        return [e for e in self.tap.exchanges if e.method == "POST"]

    @property
    def forwarded(self) -> list[Received]:
        return self.api.agent_requests()


@asynccontextmanager
async def codex_through_proxy(
    tmp_path: Path, config: str, env: dict[str, str]
) -> AsyncIterator[Run]:
    """Runs `codex exec` once (`config` is its config.toml, `{url}` the proxy's root through the
    tap) and yields what everyone saw."""
    codex = client_binary("codex")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    async with StrictResponses(CodexScript(CODEX_LIMIT), window=MODEL_WINDOW) as api:
        settings = Settings.build(
            {
                "upstream": {"base_url": api.base_url},
                "models": {"context_windows": {MODEL: WINDOWS[MODEL]}},
                "memory": {"dir": str(tmp_path / "memory")},
                "state": {"backend": "memory"},
            }
        )
        trigger = int(settings.compaction.trigger_ratio * WINDOWS[MODEL])
        runner, url = await serve_on_loopback(create_app(settings))
        try:
            async with Tap(url) as tap:
                (home / "config.toml").write_text(config.replace("{url}", tap.url))
                argv = (codex, "exec", *_FLAGS, TASK)
                out = await run(argv, {"CODEX_HOME": str(home), **_LOOPBACK_ONLY, **env}, work)
                yield Run(api, tap, out, trigger)
        finally:
            await runner.cleanup()


@pytest.mark.timeout(2 * _CLIENT_TIMEOUT_S)
async def test_codex_cli_openai_provider(tmp_path: Path) -> None:
    config = f'{_SETTINGS}openai_base_url = "{{url}}/v1"\n{_OFFLINE}'
    async with codex_through_proxy(tmp_path, config, {"OPENAI_API_KEY": "sk-e2e"}) as run:
        check_run(run)
        # One WebSocket attempt, answered 426 at once, then HTTP only: no retries.
        upgrades = [e for e in run.tap.exchanges if e.is_upgrade]
        assert [(e.method, e.path, e.status) for e in upgrades] == [("GET", "/v1/responses", 426)]
        assert run.tap.exchanges[0] is upgrades[0]
        assert all(e.method == "POST" for e in run.tap.exchanges[1:])
        # Codex's remote compaction, past the proxy's trigger, went as sent.
        triggers = [e for e in run.sent if _ends_with_trigger(e)]
        check_sent_as_is(run, triggers)
        check_compaction_items(run)


@pytest.mark.timeout(2 * _CLIENT_TIMEOUT_S)
async def test_codex_cli_custom_provider(tmp_path: Path) -> None:
    config = (
        f'{_SETTINGS}model_provider = "proxy"\n{_OFFLINE}\n'
        '[model_providers.proxy]\nname = "proxy"\nbase_url = "{url}/v1"\n'
        'env_key = "E2E_KEY"\nwire_api = "responses"\n'
    )
    async with codex_through_proxy(tmp_path, config, {"E2E_KEY": "sk-e2e"}) as run:
        check_run(run)
        assert all(e.method == "POST" for e in run.tap.exchanges)  # no WebSocket here
        # Codex's local compaction: the handoff prompt, with no tools, went as sent.
        handoffs = [e for e in run.sent if _HANDOFF_PROMPT in e.raw]
        check_sent_as_is(run, handoffs)
        assert all(e.body.get("tools") in (None, []) for e in handoffs)
        # Its summary (a user turn) is in every later request, verbatim or quoted in a fold.
        after = run.forwarded[_index_of(run.forwarded, handoffs[0].raw) + 1 :]
        assert after and all(HANDOFF.encode() in r.raw for r in after)


def check_run(run: Run) -> None:
    """What every run shows: done, nothing refused, a fold carrying the client's context, a
    recall round Codex never saw."""
    assert DONE in run.out, run.out[-3000:]
    assert run.api.refused == [], run.api.refused
    folded = [i for i, r in enumerate(run.forwarded) if _is_folded(r.raw)]
    assert folded, "the proxy never compacted"
    lost = [i for i in folded if b"<environment_context>" not in run.forwarded[i].raw]
    assert lost == [], f"the folded requests {lost} lost <environment_context>"
    rounds = [r for r in run.forwarded if _answers_recall(r)]
    assert rounds, "no recall round"
    assert not any(_holds_recall_call(e) for e in run.sent), "Codex saw a recall call"


def check_sent_as_is(run: Run, own: Sequence[Exchange]) -> None:
    """Codex's own compaction requests reached the upstream byte-identical, one of them past the
    proxy's trigger."""
    assert own, "Codex never compacted by itself"
    received = [r.raw for r in run.forwarded]
    changed = [i for i, e in enumerate(own) if not any(e.raw == raw for raw in received)]
    assert changed == [], f"Codex's own compaction requests {changed} were changed on the way"
    sizes = [body_tokens("/responses", e.body) for e in own]
    assert max(sizes) > run.trigger, (sizes, run.trigger)


def check_compaction_items(run: Run) -> None:
    """Every forwarded request after the first `compaction` item holds one, byte for byte as
    Codex sent it (so as the upstream issued it: the fake refuses any other), also once the
    conversation holding it grew past the trigger and was folded."""
    sent = {item for e in run.sent for item in _COMPACTION_ITEM.findall(e.raw)}
    assert sent, "Codex never sent a compaction item back"
    holding = [i for i, r in enumerate(run.forwarded) if _COMPACTION_ITEM.search(r.raw)]
    after = run.forwarded[holding[0] :]
    for request in after:
        items = _COMPACTION_ITEM.findall(request.raw)
        assert len(items) == 1 and items[0] in sent, items
    assert any(_is_folded(r.raw) for r in after), "no fold of a conversation holding the item"


def _is_folded(raw: bytes) -> bool:
    return SUMMARY_MARKER.encode() in raw or PREVIEW_MARK.encode() in raw


def _ends_with_trigger(exchange: Exchange) -> bool:
    return bool(exchange.body.get("input", [])[-1:] == [{"type": COMPACTION_TRIGGER}])


def _answers_recall(request: Received) -> bool:
    calls = {
        i.get("call_id")
        for i in request.items
        if isinstance(i, dict) and i.get("type") == "function_call" and i.get("name") == "recall"
    }
    return any(
        isinstance(i, dict) and i.get("type") == "function_call_output" and i["call_id"] in calls
        for i in request.items
    )


def _holds_recall_call(exchange: Exchange) -> bool:
    return any(
        isinstance(i, dict) and i.get("name") == "recall" for i in exchange.body.get("input") or []
    )


def _index_of(requests: Sequence[Received], raw: bytes) -> int:
    return next(i for i, r in enumerate(requests) if r.raw == raw)
