"""The heuristic estimator: character classes, message shapes, malformed items, speed-safe paths."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from compaction.messages import IMAGE_HIGH_TOKENS, IMAGE_LOW_TOKENS, MESSAGE_OVERHEAD_TOKENS
from compaction.tokens import (
    CL100K,
    REPLY_PRIMING_TOKENS,
    HeuristicEstimator,
    count_messages,
    estimate_request,
)
from tests import factories as f

EST = HeuristicEstimator()


def test_ascii_text_costs_a_quarter_token_per_character() -> None:
    assert EST.count_text("a" * 400) == 100


def test_chinese_costs_far_more_than_characters_over_four() -> None:
    text = "我们需要在周五之前完成数据库迁移" * 10
    assert EST.count_text(text) > 2 * len(text) / 4


def test_cl100k_rates_count_cjk_about_one_token_per_character() -> None:
    text = "数据库迁移" * 100
    assert 0.8 * len(text) <= HeuristicEstimator(rates=CL100K).count_text(text) <= 1.2 * len(text)


def test_mixed_text_is_counted_per_character_class() -> None:
    english, chinese = "x" * 400, "数" * 100
    assert EST.count_text(english + chinese) == EST.count_text(english) + EST.count_text(chinese)


def test_hangul_and_kana_are_counted_as_cjk_not_as_ascii() -> None:
    for text in ("안녕하세요" * 20, "ファイルを確認" * 20):
        assert EST.count_text(text) > len(text) / 3


def test_calibration_multiplies_every_count() -> None:
    doubled = HeuristicEstimator(calibration=2.0)
    message = f.user("hello there " * 50)
    assert doubled.count_text("a" * 400) == 200
    assert abs(doubled.count_message(message) - 2 * EST.count_message(message)) <= 1


def test_every_message_pays_an_overhead() -> None:
    assert EST.count_message({"role": "assistant", "content": ""}) == MESSAGE_OVERHEAD_TOKENS
    assert EST.count_message({"role": "assistant", "content": None}) == MESSAGE_OVERHEAD_TOKENS


def test_images_cost_a_fixed_amount_by_detail() -> None:
    low = EST.count_message(f.content_parts("", "low"))
    high = EST.count_message(f.content_parts("", "high"))
    assert low == MESSAGE_OVERHEAD_TOKENS + IMAGE_LOW_TOKENS
    assert high == MESSAGE_OVERHEAD_TOKENS + IMAGE_HIGH_TOKENS


def test_text_parts_count_like_strings() -> None:
    text = "describe this " * 40
    parts = {"role": "user", "content": [{"type": "text", "text": text}]}
    assert EST.count_message(parts) == EST.count_message(f.user(text))


def test_audio_and_file_parts_cost_something() -> None:
    for part in (
        {"type": "input_audio", "input_audio": {"data": "x"}},
        {"type": "file", "file": {}},
    ):
        assert EST.count_message({"role": "user", "content": [part]}) > 50


def test_tool_calls_ids_and_names_are_counted() -> None:
    args = {"command": "grep -rn needle " + "src/ " * 100}
    call = f.assistant_calls(f.tool_call("call_1", "bash", args))
    assert EST.count_message(call) > len(orjson.dumps(args)) / 4
    plain = {"role": "tool", "content": "ok"}
    assert (
        EST.count_message({**plain, "tool_call_id": "call_" + "x" * 80})
        > EST.count_message(plain) + 15
    )
    assert EST.count_message({**plain, "name": "n" * 80}) > EST.count_message(plain) + 15


def test_malformed_items_count_their_json_size_and_never_raise() -> None:
    for item in [
        *f.malformed_items(),
        {"role": "user", "content": {"odd": 1}},
        {"role": "assistant", "tool_calls": "x"},
        object(),
    ]:
        assert EST.count_message(item) >= MESSAGE_OVERHEAD_TOKENS
    big = {"role": "user", "content": {"blob": "z" * 4000}}
    assert EST.count_message(big) >= 1000


def test_tools_count_their_json_definitions() -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "bash", "description": "d" * 400, "parameters": {}},
        }
    ]
    assert EST.count_tools(None) == 0
    assert EST.count_tools([]) == 0
    assert EST.count_tools(tools) >= 100


def test_estimate_request_adds_messages_tools_and_priming() -> None:
    messages = f.simple_conversation(3)
    tools = [{"type": "function", "function": {"name": "bash"}}]
    expected = (
        sum(EST.count_message(m) for m in messages) + EST.count_tools(tools) + REPLY_PRIMING_TOKENS
    )
    assert estimate_request(messages, tools, EST) == expected


@given(f.conversations(malformed=True))
def test_any_generated_conversation_gets_a_positive_estimate(messages: list[object]) -> None:
    total = estimate_request(messages, None, EST)
    assert total >= REPLY_PRIMING_TOKENS + MESSAGE_OVERHEAD_TOKENS * len(messages)


def test_a_few_non_ascii_symbols_in_long_ascii_text_add_a_little_each() -> None:
    text = "x" * 4000 + "“quoted” — done"
    assert 1000 < EST.count_text(text) <= 1000 + 4 + 5


@given(st.text(max_size=300))
def test_least_tokens_bounds_any_text_from_below(text: str) -> None:
    """What lets the transcript skip counting a stage that cannot fit (rounding aside)."""
    for estimator in (EST, HeuristicEstimator(1.7, CL100K), HeuristicEstimator(0.5)):
        assert estimator.least_tokens(len(text)) <= estimator.count_text(text) + 0.5


class _PerMessage:
    """An estimator that counts only one message at a time (no count_messages of its own)."""

    def __init__(self, inner: HeuristicEstimator) -> None:
        self.inner = inner

    def count_text(self, text: str) -> int:
        return self.inner.count_text(text)

    def count_message(self, message: object) -> int:
        return self.inner.count_message(message)

    def count_tools(self, tools: object) -> int:
        return self.inner.count_tools(tools)


@given(f.conversations(malformed=True), st.sampled_from([1.0, 0.83, 1.37]))
def test_counting_a_list_is_counting_each_message(messages: list[object], factor: float) -> None:
    estimator = HeuristicEstimator(factor)
    each = [estimator.count_message(m) for m in messages]
    assert count_messages(messages, estimator) == each
    assert count_messages(messages, _PerMessage(estimator)) == each
    assert estimate_request(messages, None, estimator) == sum(each) + REPLY_PRIMING_TOKENS
