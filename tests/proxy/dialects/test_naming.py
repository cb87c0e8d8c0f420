"""The names clients give their conversations in a body, as each dialect reads them, made
session ids scoped by credential (proxy.dialects.naming, proxy.compacting.decision.identity)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction import is_valid_session_id
from proxy.compacting.decision.identity import named_session
from proxy.dialects import Dialect
from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.dialects.responses import RESPONSES_API

DIALECTS = (CHAT_COMPLETIONS, RESPONSES_API, ANTHROPIC_MESSAGES)


def named(dialect: Dialect, payload: Mapping[str, object], tenant: bytes = b"t") -> str | None:
    return named_session(dialect.session_name(payload), tenant)


@given(name=st.text(min_size=1, max_size=2000), tenant=st.binary(max_size=32))
def test_every_named_session_is_a_valid_id(name: str, tenant: bytes) -> None:
    for dialect, payload in (
        (RESPONSES_API, {"prompt_cache_key": name}),
        (RESPONSES_API, {"client_metadata": {"session_id": name}}),
        (
            ANTHROPIC_MESSAGES,
            {"metadata": {"user_id": orjson.dumps({"session_id": name}).decode()}},
        ),
    ):
        session = named(dialect, payload, tenant)
        assert session is None or is_valid_session_id(session)


def test_client_names_are_read_from_the_known_fields() -> None:
    old_claude = {"metadata": {"user_id": "user_ab12_account_cd34_session_5f0c3a52-0d3e"}}
    assert named(ANTHROPIC_MESSAGES, old_claude) == named(
        ANTHROPIC_MESSAGES, {"metadata": {"user_id": '{"session_id": "5f0c3a52-0d3e"}'}}
    )
    for dialect in DIALECTS:
        assert named(dialect, {"metadata": {"session_id": "s1"}}) is not None
    turn = orjson.dumps({"session_id": "run-1", "thread_id": "thread-2"}).decode()
    codex = {"client_metadata": {"x-codex-turn-metadata": turn}, "prompt_cache_key": "thread-2"}
    assert named(RESPONSES_API, codex) == named(RESPONSES_API, {"prompt_cache_key": "thread-2"})
    assert named(RESPONSES_API, codex).startswith("thread-2-")  # type: ignore[union-attr]
    # The specific field wins over the shared prompt cache key.
    assert named(
        RESPONSES_API, {"prompt_cache_key": "app-wide", "client_metadata": {"session_id": "t1"}}
    ) == named(RESPONSES_API, {"client_metadata": {"session_id": "t1"}})
    for dialect in DIALECTS:
        for nothing in ({}, {"metadata": {"user_id": "user_ab12"}}, {"prompt_cache_key": " "}):
            assert named(dialect, nothing) is None


@pytest.mark.parametrize("dialect", [CHAT_COMPLETIONS, RESPONSES_API])
def test_the_openai_shaped_apis_read_every_clients_fields(dialect: Dialect) -> None:
    assert dialect.session_name({"prompt_cache_key": "k1"}) == "k1"
    assert dialect.session_name({"client_metadata": {"session_id": "c1"}}) == "c1"
    assert dialect.session_name({"metadata": {"user_id": '{"session_id": "u1"}'}}) == "u1"


def test_anthropic_reads_only_the_fields_its_api_carries() -> None:
    # Anthropic refuses unknown top-level fields ("Extra inputs are not permitted"), so an
    # OpenAI field in a Messages request names nothing: the fingerprint decides.
    assert ANTHROPIC_MESSAGES.session_name({"prompt_cache_key": "k1"}) is None
    assert ANTHROPIC_MESSAGES.session_name({"client_metadata": {"session_id": "c1"}}) is None
    assert ANTHROPIC_MESSAGES.session_name({"metadata": {"user_id": '{"session_id": "u1"}'}}) == (
        "u1"
    )
