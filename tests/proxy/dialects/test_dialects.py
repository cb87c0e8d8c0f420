"""Each dialect on its own: what it compacts, what it counts, how it asks for a summary."""

from __future__ import annotations

import orjson
import pytest

from bench.dialects import check_anthropic, check_responses
from proxy.dialects import Dialect, NotCompactable, for_route
from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.dialects.responses import RESPONSES_API
from tests.fakes.apis import anthropic_message, responses_object
from tests.fakes.upstream import chat_completion

ASKED = [{"role": "system", "content": "Summarize."}, {"role": "user", "content": "<t>x</t>"}]


def test_each_hooked_route_has_its_dialect() -> None:
    assert for_route("chat") is CHAT_COMPLETIONS
    assert for_route("responses") is RESPONSES_API
    assert for_route("messages") is ANTHROPIC_MESSAGES
    assert for_route("forward") is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "input": "just a string"}',
        b'{"model": "m", "input": [], "previous_response_id": "resp_1"}',
        b'{"model": "m", "input": [], "conversation": {"id": "conv_1"}}',
        b"[1, 2]",
        b"not json",
    ],
)
def test_responses_without_a_local_history_are_not_compacted(body: bytes) -> None:
    with pytest.raises(NotCompactable):
        RESPONSES_API.parse(body)


def test_usage_gives_the_prompt_as_each_api_counts_it() -> None:
    assert CHAT_COMPLETIONS.prompt_tokens({"prompt_tokens": 12}) == 12
    assert RESPONSES_API.prompt_tokens({"input_tokens": 30, "output_tokens": 2}) == 30
    cached = {
        "input_tokens": 5,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 1000,
    }
    assert ANTHROPIC_MESSAGES.prompt_tokens(cached) == 1105
    assert ANTHROPIC_MESSAGES.prompt_tokens({"output_tokens": 3}) is None


def test_what_a_request_costs_besides_its_list() -> None:
    payload = {"instructions": "Be brief.", "tools": [{"name": "t"}], "input": []}
    assert RESPONSES_API.extras(payload) == ["Be brief.", [{"name": "t"}]]
    assert ANTHROPIC_MESSAGES.extras({"system": [{"type": "text", "text": "S"}]}) == [
        [{"type": "text", "text": "S"}]
    ]
    assert RESPONSES_API.max_output({"max_output_tokens": 500}) == 500
    assert ANTHROPIC_MESSAGES.max_output({"max_tokens": 64}) == 64


def test_summary_requests_and_answers_take_each_apis_shape() -> None:
    chat = orjson.loads(CHAT_COMPLETIONS.summary_body("m", ASKED, 100, {"max_tokens"}))
    assert chat["messages"] == ASKED and chat["max_completion_tokens"] == 100
    responses = orjson.loads(RESPONSES_API.summary_body("m", ASKED, 100, {"temperature"}))
    assert responses["instructions"] == "Summarize." and responses["store"] is False
    assert responses["input"] == ASKED[1:] and "temperature" not in responses
    anthropic = orjson.loads(ANTHROPIC_MESSAGES.summary_body("m", ASKED, 100, set()))
    assert anthropic["system"] == "Summarize." and anthropic["messages"] == ASKED[1:]
    assert anthropic["max_tokens"] == 100

    assert CHAT_COMPLETIONS.summary_text(chat_completion("sum")) == "sum"
    assert RESPONSES_API.summary_text(responses_object("sum")) == "sum"
    thought = ("hmm", "sig")
    assert ANTHROPIC_MESSAGES.summary_text(anthropic_message("sum", thinking=thought)) == "sum"
    for dialect in (CHAT_COMPLETIONS, RESPONSES_API, ANTHROPIC_MESSAGES):
        assert dialect.summary_text({"unexpected": True}) is None


def test_the_opening_names_a_conversation_by_its_head_tools_and_first_request() -> None:
    one = {"instructions": "I", "tools": [{"type": "function", "name": "b"}]}
    items = [{"role": "developer", "content": "D"}, {"role": "user", "content": "task"}]
    assert RESPONSES_API.opening(one, items) == {"head": ["I", "D"], "tools": ["b"], "user": "task"}
    turns = [{"role": "user", "content": "task"}]
    assert ANTHROPIC_MESSAGES.opening({"system": "S", "tools": [{"name": "b"}]}, turns) == {
        "head": "S",
        "tools": ["b"],
        "user": "task",
    }


@pytest.mark.parametrize(
    ("dialect", "field"),
    [(CHAT_COMPLETIONS, "messages"), (RESPONSES_API, "input"), (ANTHROPIC_MESSAGES, "messages")],
)
def test_serializing_changes_the_list_and_no_other_byte(dialect: Dialect, field: str) -> None:
    head = b'{"model" : "m", "x": 1.50, "s": "\\u00e9\\/", "'
    tail = b', "z": [1.0, {"a": null}]}'
    body = head + field.encode() + b'": [{"role": "user", "content": "hi"}]' + tail
    payload, _ = dialect.parse(body)
    sent = dialect.serialize(body, payload, [{"role": "user", "content": "new"}])
    assert sent == head + field.encode() + b'": [{"role":"user","content":"new"}]' + tail


# -- the fakes' checkers (bench.dialects): what the real APIs refuse ----------------------------


def test_the_anthropic_checker_reports_malformed_turns_and_blocks_instead_of_failing() -> None:
    body = {"messages": [{"role": "user", "content": ["x", None]}, "junk"]}
    problems = check_anthropic(body, {})
    assert any("not a block" in p for p in problems)
    assert any("not a turn" in p for p in problems)


def test_the_responses_checker_refuses_a_call_sent_without_the_reasoning_it_came_with() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    user = {"type": "message", "role": "user", "content": "go"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    seen: dict[str, object] = {}
    assert check_responses({"input": [user, reasoning, call, output]}, seen) == []
    # The next request drops that reasoning item, and no other reasoning survives anywhere.
    assert check_responses({"input": [user, call, output]}, seen) == [
        "input[1]: call without the reasoning of its turn"
    ]
    # A call that never had reasoning needs none.
    plain = {**call, "call_id": "c2"}
    assert check_responses({"input": [user, plain, {**output, "call_id": "c2"}]}, seen) == []


def test_a_chat_answer_of_any_other_shape_holds_no_summary_text() -> None:
    odd: list[object] = [
        [],
        "text",
        {"choices": []},
        {"choices": "text"},
        {"choices": {"0": {"message": {"content": "x"}}}},
        {"choices": [["message"]]},
        {"choices": [{"text": "x"}]},
    ]
    for answer in odd:
        assert CHAT_COMPLETIONS.summary_text(answer) is None
    assert CHAT_COMPLETIONS.summary_text({"choices": [{"message": {"content": "x"}}]}) == "x"


def test_each_dialect_declares_a_tool_in_its_apis_shape() -> None:
    parameters = {"type": "object", "properties": {}}
    assert CHAT_COMPLETIONS.tool("recall", "d", parameters) == {
        "type": "function",
        "function": {"name": "recall", "description": "d", "parameters": parameters},
    }
    assert RESPONSES_API.tool("recall", "d", parameters) == {
        "type": "function",
        "name": "recall",
        "description": "d",
        "parameters": parameters,
        "strict": False,
    }
    assert ANTHROPIC_MESSAGES.tool("recall", "d", parameters) == {
        "name": "recall",
        "description": "d",
        "input_schema": parameters,
    }


def test_each_dialect_reads_what_a_response_spent_from_its_own_usage_fields() -> None:
    chat = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    assert CHAT_COMPLETIONS.spent_tokens(chat) == (120, 30)
    assert CHAT_COMPLETIONS.spent_tokens({"input_tokens": 5}) == (0, 0)
    spent = {"input_tokens": 90, "output_tokens": 12, "cache_read_input_tokens": 400}
    assert RESPONSES_API.spent_tokens(spent) == (90, 12)
    assert ANTHROPIC_MESSAGES.spent_tokens(spent) == (90, 12)
    for dialect in (CHAT_COMPLETIONS, RESPONSES_API, ANTHROPIC_MESSAGES):
        assert dialect.spent_tokens(None) == (0, 0)
        assert dialect.spent_tokens({"prompt_tokens": "many", "input_tokens": None}) == (0, 0)


def test_the_proxys_own_errors_take_each_apis_shape() -> None:
    # https://docs.anthropic.com/en/api/errors: {"type": "error", "error": {"type", "message"}}
    assert orjson.loads(ANTHROPIC_MESSAGES.error_body(413, "too big", "x", "c")) == {
        "type": "error",
        "error": {"type": "request_too_large", "message": "too big"},
    }
    assert orjson.loads(ANTHROPIC_MESSAGES.error_body(502, "down", "upstream_error", "c")) == {
        "type": "error",
        "error": {"type": "api_error", "message": "down"},
    }
    for dialect in (CHAT_COMPLETIONS, RESPONSES_API):
        assert orjson.loads(dialect.error_body(400, "bad", "invalid_request_error", "c")) == {
            "error": {"message": "bad", "type": "invalid_request_error", "code": "c"}
        }


def test_only_chat_carries_calls_beside_a_messages_content() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    assert CHAT_COMPLETIONS.calls_outside_content(message) == calls
    assert RESPONSES_API.calls_outside_content(message) is None
    assert ANTHROPIC_MESSAGES.calls_outside_content(message) is None
