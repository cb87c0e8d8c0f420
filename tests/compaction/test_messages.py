"""The neutral view: how the chat shape reads into Items, and the block rule over any shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compaction import CHAT, Compactor, HeuristicEstimator, Item, ToolCall, read_items
from compaction.invariants import check_tool_pairing, find_pairing_problems
from compaction.marker import SUMMARY_MARKER, is_summary_text
from compaction.messages import LEGACY_CALL_PREFIX, is_summary_message, json_text
from compaction.segment import split
from compaction.summarize import summary_message, summary_text
from tests import factories as f

EST = HeuristicEstimator()


def block_spans(messages: list[Any], **kwargs: Any) -> list[tuple[int, int]]:
    segments = split(messages, EST, **kwargs)
    return [(b.start, b.end) for r in segments.rounds for b in r.blocks]


# ---------------------------------------------------------------- the chat shape


def test_roles_read_into_kinds() -> None:
    items = read_items([f.system(), f.developer(), f.user("hi"), f.assistant("hello"), f.summary()])
    assert [i.kind for i in items] == ["head", "head", "user", "assistant", "summary"]
    assert [i.label for i in items] == ["system", "developer", "user", "assistant", "user"]
    assert items[2].text == "hi" and items[2].is_request and items[3].is_prose
    assert not items[4].is_request and not items[4].is_prose


def test_user_and_assistant_items_are_built_field_by_field_as_by_name() -> None:
    """The reader builds these two from their fields in order (the common case, at less cost):
    the same Items as the named fields give."""
    observation = "<returncode>0</returncode>"
    call = f.tool_call("a")
    assert CHAT.read(f.user("hi")) == Item("user", "hi", label="user")
    assert CHAT.read(f.user(observation)) == Item(
        "user", observation, observation=True, label="user"
    )
    assert CHAT.read(f.assistant("ok")) == Item("assistant", "ok", label="assistant")
    calls = (ToolCall("a", call["function"]["name"], call["function"]["arguments"]),)
    assert CHAT.read(f.assistant_calls(call)) == Item(
        "assistant", "", calls=calls, label="assistant"
    )


def test_content_parts_give_their_text_and_media_placeholders() -> None:
    item = CHAT.read(f.content_parts("What is this?"))
    assert item.kind == "user"
    assert item.text == "What is this?\n[image_url]"


def test_parallel_calls_are_read_with_ids_names_and_raw_arguments() -> None:
    first, second = f.tool_call("a"), f.tool_call("b", name="read", arguments={"path": "x.py"})
    item = CHAT.read(f.assistant_calls(first, second, content="looking"))
    assert item.kind == "assistant" and item.text == "looking"
    assert item.call_ids == ("a", "b")
    assert item.calls[1] == ToolCall("b", "read", '{"path":"x.py"}')
    assert item.calls[1].parsed() == {"path": "x.py"}
    result = CHAT.read(f.tool_result("b", "done"))
    assert (result.kind, result.answers, result.text) == ("tool", ("b",), "done")


def test_a_mini_swe_observation_is_a_user_item_marked_as_tool_output() -> None:
    item = CHAT.read(f.user("  <returncode>0</returncode>\n<output>ok</output>"))
    assert item.kind == "user" and item.observation and not item.is_request


def test_malformed_items_never_raise_and_read_as_other() -> None:
    for raw in f.malformed_items():
        item = CHAT.read(raw)
        assert isinstance(item, Item)
    broken = CHAT.read({"content": "no role"})
    assert broken.is_malformed and broken.text == repr({"content": "no role"})
    assert CHAT.read(42).is_malformed
    odd = CHAT.read({"role": "critic", "content": "hmm"})
    assert odd.kind == "other" and odd.label == "critic" and not odd.is_malformed


def test_malformed_calls_keep_what_pairing_and_ledgers_each_need() -> None:
    raw = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "only_id"},  # counts for pairing, not a function
            {"type": "function", "function": {"name": "bash", "arguments": 3}},  # no id
            "not a call",
            {"id": 7, "function": "nope"},  # neither
        ],
    }
    item = CHAT.read(raw)
    assert item.call_ids == ("only_id",)
    assert [c.name for c in item.functions] == ["bash"]
    assert item.functions[0].arguments == "" and item.functions[0].parsed() == {}
    result = CHAT.read({"role": "tool", "content": "x"})
    assert result.kind == "tool" and result.answers == ()


def test_legacy_function_call_pairs_with_its_function_result_by_name() -> None:
    call = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    answer = {"role": "function", "name": "get_weather", "content": "sunny"}
    assert CHAT.read(call).calls == (
        ToolCall(LEGACY_CALL_PREFIX + "get_weather", "get_weather", '{"city":"Paris"}'),
    )
    assert CHAT.read(answer).answers == (LEGACY_CALL_PREFIX + "get_weather",)
    messages = [f.user(), call, answer, f.assistant()]
    assert block_spans(messages) == [(0, 1), (1, 3), (3, 4)]
    assert check_tool_pairing(messages) == []
    assert check_tool_pairing([f.user(), answer]) != []


def test_the_summary_message_round_trips_through_the_shape() -> None:
    message = summary_message("Goals: ship it.")
    assert is_summary_message(message) and CHAT.is_summary(message)
    assert message == CHAT.summary_message(message["content"])
    assert summary_text(message) == "Goals: ship it."
    assert CHAT.read(message).kind == "summary"
    assert is_summary_text(message["content"]) and message["content"].startswith(SUMMARY_MARKER)
    assert not is_summary_message({"role": "assistant", "content": SUMMARY_MARKER})


def test_measure_counts_every_piece_a_chat_message_carries() -> None:
    def cost(text: str) -> float:
        return float(len(text))

    plain = CHAT.measure({"role": "user", "content": "abcd"}, cost)
    named = CHAT.measure({"role": "user", "content": "abcd", "name": "xy"}, cost)
    assert named == plain + 2
    call = f.assistant_calls(f.tool_call("id1", name="ls", arguments={}))
    assert CHAT.measure(call, cost) > CHAT.measure({"role": "assistant", "content": None}, cost)
    assert CHAT.measure(["odd"], cost) > len(json_text(["odd"]))


# ---------------------------------------------------------------- blocks over chat


def test_parallel_calls_and_their_results_are_one_block() -> None:
    messages = [f.user(), *f.tool_block(3), f.assistant()]
    assert block_spans(messages) == [(0, 1), (1, 5), (5, 6)]


def test_a_second_assistant_with_calls_starts_its_own_block_in_chat() -> None:
    first, second = f.tool_call("a"), f.tool_call("b")
    messages = [f.user(), f.assistant_calls(first), f.assistant_calls(second), f.tool_result("b")]
    assert block_spans(messages) == [(0, 1), (1, 2), (2, 4)]
    assert [p.kind for p in find_pairing_problems(messages)] == ["unanswered call"]


# ---------------------------------------------------------------- the rule over another shape


class ItemShape:
    """A shape whose raw messages are already Items: lets a test lay out any neutral sequence."""

    def read(self, raw: Any) -> Item:
        return raw if isinstance(raw, Item) else Item("other", repr(raw))

    def summary_message(self, text: str) -> Any:
        return Item("summary", text, label="summary")

    def is_summary(self, raw: Any) -> bool:
        return isinstance(raw, Item) and raw.kind == "summary"

    def measure(self, raw: Any, text_cost: Callable[[str], float]) -> float:
        return 4 + text_cost(raw.text if isinstance(raw, Item) else repr(raw))

    def with_output(self, raw: Any, reduce: Callable[[str], str]) -> Any:
        return None


ITEMS = ItemShape()


def call(call_id: str) -> Item:
    return Item("assistant", calls=(ToolCall(call_id, "bash", "{}"),), joins=True, label="call")


def output(call_id: str) -> Item:
    return Item("tool", "ok", answers=(call_id,), label="output")


REASONING = Item("other", "thinking", lead=True, label="reasoning")
USER = Item("user", "go", label="user")
REPLY = Item("assistant", "done", label="message")


def test_lead_items_stay_with_the_calls_after_them() -> None:
    messages = [USER, REASONING, call("a"), output("a"), REPLY]
    assert block_spans(messages, shape=ITEMS) == [(0, 1), (1, 4), (4, 5)]


def test_consecutive_joining_call_items_and_their_outputs_are_one_block() -> None:
    messages = [USER, call("a"), REASONING, call("b"), output("a"), output("b"), REPLY]
    assert block_spans(messages, shape=ITEMS) == [(0, 1), (1, 6), (6, 7)]
    assert find_pairing_problems(messages, shape=ITEMS) == []


def test_a_call_after_outputs_began_starts_a_new_block() -> None:
    messages = [USER, call("a"), output("a"), call("b"), output("b")]
    assert block_spans(messages, shape=ITEMS) == [(0, 1), (1, 3), (3, 5)]
    assert find_pairing_problems(messages, shape=ITEMS) == []


def test_an_unanswered_joining_call_is_reported_once() -> None:
    messages = [USER, call("a"), call("b"), output("b"), REPLY]
    problems = find_pairing_problems(messages, shape=ITEMS)
    assert [(p.kind, p.call_id) for p in problems] == [("unanswered call", "a")]
    assert block_spans(messages, shape=ITEMS) == [(0, 1), (1, 4), (4, 5)]


async def test_a_compactor_with_another_shape_folds_whole_blocks_and_inserts_its_summary() -> None:
    messages: list[Any] = [Item("head", "be brief", label="system")]
    for i in range(12):
        messages += [
            Item("user", f"request {i}: " + "please look " * 40, label="user"),
            REASONING,
            call(f"c{i}"),
            call(f"d{i}"),
            output(f"c{i}"),
            output(f"d{i}"),
            Item("assistant", "We decided to use SQLite. " * 20, label="message"),
        ]
    compactor = Compactor(shape=ITEMS)
    compaction = await compactor.prepare(messages, window=int(compactor.estimate(messages) / 0.9))
    plan = compaction.plan
    result = await compaction.run(llm=None, session_id=None)
    assert result.path == "extractive"
    assert ITEMS.is_summary(result.messages[1]) and "SQLite" in result.summary_text
    kept = result.messages[result.prefix_len :]
    assert kept[0].kind == "user" and kept == messages[plan.keep_from :]
    assert find_pairing_problems(result.messages, shape=ITEMS) == []


def test_legacy_function_call_arguments_are_counted() -> None:
    big = '{"text": "' + "x" * 40_000 + '"}'
    call = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": big}}
    assert HeuristicEstimator().count_message(call) >= 10_000  # ~40k characters of arguments


def test_mini_swe_format_reminders_are_observations_not_requests() -> None:
    reminder = f.user("Please always provide EXACTLY ONE action in triple backticks, found 2.")
    assert CHAT.read(reminder).observation and not CHAT.read(reminder).is_request
