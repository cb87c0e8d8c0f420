"""A conversation that holds the provider's own compaction, grown past the trigger through real
HTTP: the compaction stays byte-identical and in place in every forwarded request, and the proxy
folds only what follows it. And the client's injected context survives a fold.

The rules, as the providers document them:
- OpenAI: the `compaction` item "carries forward key prior state ... It is opaque and not
  intended to be human-interpretable"; send it back with the items after it
  (developers.openai.com/api/docs/guides/compaction). Codex sends it as
  `{"type": "compaction", "encrypted_content": "gAAAA..."}`.
- Anthropic: "Put the block first in `messages`, either as an `assistant` message of its own or
  as the first content block of the first message", "Keep the `compaction` block exactly as the
  API returned it, including its `signature`", "Send exactly one `compaction` block per
  request", with the `compact-2026-09-04` beta header on every request that carries it
  (platform.claude.com/docs/en/build-with-claude/compaction-on-demand).
- Codex's `<environment_context>` (cwd, shell, date, workspace roots) is what the model knows of
  where it works: after a fold the latest one still reaches it, verbatim.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import orjson
import pytest

from compaction import SUMMARY_MARKER
from compaction.messages import ANTHROPIC, RESPONSES
from tests import factories as f
from tests.fakes.script import Script, body_tokens
from tests.fakes.upstream import FakeUpstream, Recorded
from tests.proxy.compacting.conftest import WINDOW
from tests.proxy.compacting.test_stepping_aside import send, shaped, spaced

COMPACTION_BETA = "compact-2026-09-04"


def ciphertext(size: int) -> str:
    return base64.b64encode(random.Random(size).randbytes(size)).decode()


def responses_user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def environment(cwd: str) -> dict[str, Any]:
    return responses_user(
        f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n"
        "  <current_date>2026-12-07</current_date>\n</environment_context>"
    )


def grown(path: str, prefix: list[dict[str, Any]], start: int, target: int) -> list[Any]:
    """Chat rounds after `prefix` (items of the API at `path`) until the request reaches
    `target` tokens; the list ends with a user request."""
    messages: list[dict[str, Any]] = []
    i = start
    while True:
        body = shaped(path, [*messages, f.user(f"Now do task {i}.")])
        listed = "input" if path.endswith("/responses") else "messages"
        body[listed] = [*prefix, *body[listed]]
        if body_tokens(path, body) >= target:
            return body[listed]
        messages += f.tool_round(i, blocks=2, output_chars=300)
        i += 1


def responses_request(items: list[Any]) -> dict[str, Any]:
    return {**shaped("/v1/responses", []), "input": items}


def anthropic_request(turns: list[Any]) -> dict[str, Any]:
    return {**shaped("/v1/messages", []), "messages": turns}


# ---------------------------------------------------------------------- Responses


async def test_a_compaction_item_stays_byte_identical_and_in_place_as_the_conversation_grows(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA" + ciphertext(900)}
    prefix = [responses_user("Fix the flaky build."), environment("/repo"), item]
    at = len(prefix) - 1
    items = prefix
    for step in range(3):
        items = grown("/v1/responses", items[:-1] if step else items, 10 * step, int(WINDOW * 1.2))
        raw = spaced(responses_request(items))
        response, _ = await send(client, proxy, "/v1/responses", raw, **{"X-Session-Id": "cx"})
        assert response.status == 200
        assert response.headers["x-compaction-status"] in ("applied", "reused")
        forwarded = script.calls(None)[-1]
        sent = forwarded.json()["input"]
        assert sent[: at + 1] == items[: at + 1]  # in place, everything before it as sent
        assert RESPONSES.is_summary(sent[at + 1])  # only what follows it was folded
        assert spaced(item) in forwarded.body  # the client's own bytes
        assert sent.count(item) == 1
    assert len(script.calls("summary")) >= 1
    assert script.problems == []


# ---------------------------------------------------------------------- Anthropic


def compaction_turn() -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {
                "type": "compaction",
                "content": "Summary of the conversation: the user is fixing a flaky build.",
                "signature": "EuYBCkQY" + ciphertext(600),
            }
        ],
    }


def compaction_problems(forwarded: Recorded, block_turn: dict[str, Any]) -> list[str]:
    """What Anthropic refuses (or silently misreads) about a compaction block, per the
    compaction-on-demand page: the block first, exactly one, as returned, with the beta."""
    problems = []
    turns = forwarded.json()["messages"]
    blocks = [
        (i, k)
        for i, turn in enumerate(turns)
        if isinstance(turn.get("content"), list)
        for k, block in enumerate(turn["content"])
        if block.get("type") == "compaction"
    ]
    if blocks != [(0, 0)]:
        problems.append(f"compaction blocks at {blocks}, not exactly one leading messages")
    if turns[0] != block_turn or orjson.dumps(block_turn) not in forwarded.body:
        problems.append("the compaction turn is not byte-exact")
    if COMPACTION_BETA not in forwarded.headers.get("anthropic-beta", ""):
        problems.append("a request carrying the block without its beta header")
    return problems


@pytest.fixture
async def anthropic_proxy(start: Any, upstream: FakeUpstream) -> Any:
    return await start(upstream={"anthropic_base_url": upstream.base_url})


async def test_a_conversation_led_by_a_compaction_block_keeps_it_first_and_exact(
    anthropic_proxy: Any, script: Script, client: Any
) -> None:
    turn = compaction_turn()
    turns = [turn]
    for step in range(3):
        turns = grown("/v1/messages", turns[:-1] if step else turns, 10 * step, int(WINDOW * 1.2))
        raw = orjson.dumps(anthropic_request(turns))
        response, _ = await send(
            client,
            anthropic_proxy,
            "/v1/messages",
            raw,
            **{"X-Session-Id": "cc", "anthropic-beta": COMPACTION_BETA},
        )
        assert response.status == 200
        assert response.headers["x-compaction-status"] in ("applied", "reused")
        forwarded = script.calls(None)[-1]
        assert compaction_problems(forwarded, turn) == []
        sent = forwarded.json()["messages"]
        # Only what follows the block is folded: our summary comes right after it (joined with
        # the user turns after it, as Anthropic's turns alternate).
        assert sent[1]["role"] == "user"
        assert SUMMARY_MARKER in ANTHROPIC.read(sent[1]).text.split("\n")[0]
    # The shared checker knows no compaction block: a turn it leads is all it reports.
    assert all(p == "messages[0]: the first turn is not the user's" for p in script.problems)


# ---------------------------------------------------------------------- injected context


async def test_the_latest_environment_context_is_in_every_request_after_a_fold(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    developer = {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}],
    }
    first_env, moved_env = environment("/repo"), environment("/repo/service")
    items = [developer, first_env, responses_user("Fix the flaky build.")]
    latest = first_env
    for step in range(4):
        if step == 2:  # the user moved: Codex sends the new context
            items = [*items[:-1], moved_env, items[-1]]
            latest = moved_env
        items = grown("/v1/responses", items[:-1] if step else items, 10 * step, int(WINDOW * 1.2))
        raw = spaced(responses_request(items))
        response, _ = await send(client, proxy, "/v1/responses", raw, **{"X-Session-Id": "env"})
        assert response.headers["x-compaction-status"] in ("applied", "reused")
        forwarded = script.calls(None)[-1]
        sent = forwarded.json()["input"]
        assert latest in sent, f"step {step}: the latest <environment_context> was folded"
        assert spaced(latest) in forwarded.body
        if latest is moved_env:
            assert first_env not in sent or sent.index(first_env) < sent.index(moved_env)
    assert script.problems == []
