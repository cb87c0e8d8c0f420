"""Ledgers: requests, the tool trail, files and values collected by code; sections read back."""

from __future__ import annotations

from compaction import HeuristicEstimator, MemoryItem, read_items
from compaction.ledger import Ledger, build_ledger, is_overflow_item, overflow_items
from compaction.messages import Item, ToolCall
from compaction.sections import read_body, render_sections, render_task
from tests.factories import assistant, assistant_calls, tool_call, tool_result, user

ESTIMATOR = HeuristicEstimator()


def _ledger(messages: list[dict[str, object]]) -> Ledger:
    return build_ledger(read_items(messages), range(len(messages)))


def test_every_tool_call_is_in_the_trail_with_its_outcome() -> None:
    edit = tool_call(
        name="str_replace_editor", arguments={"command": "view", "path": "/repo/src/app.py"}
    )
    run = tool_call(
        name="execute_bash", arguments={"command": "cd /repo && pytest tests/test_app.py -q"}
    )
    messages = [
        user("fix it"),
        assistant_calls(edit, run),
        tool_result(edit["id"], "file body"),
        tool_result(
            run["id"], "E   boom\nValueError: bad input 42\n[Command finished with exit code 1]"
        ),
    ]
    ledger = _ledger(messages)
    assert ledger.trail == (
        "str_replace_editor(command=view, path=/repo/src/app.py) → ok",
        "$ cd /repo && pytest tests/test_app.py -q → exit 1; ValueError: bad input 42",
    )
    assert {"/repo/src/app.py", "tests/test_app.py", "/repo"} <= set(ledger.files)


def test_non_shell_calls_show_arguments_and_the_ids_in_their_result() -> None:
    call = tool_call(name="get_user_details", arguments={"user_id": "mia_li_3668"})
    result = '{"reservations": [{"reservation_id": "NO6JO3"}], "payment_id": "gift_card_7"}'
    ledger = _ledger([assistant_calls(call), tool_result(call["id"], result)])
    assert ledger.trail == ("get_user_details(user_id=mia_li_3668) → ids: NO6JO3, gift_card_7",)
    assert ledger.files == ()  # an airport code or user id is not a path


def test_mini_swe_actions_pair_with_their_observations() -> None:
    reply = "THOUGHT: look.\n\n```bash\nsed -n '100,140p' django/db/models/query.py\n```"
    messages = [
        user("Fix the QuerySet bug"),
        assistant(reply),
        user("<returncode>1</returncode>\n<output>\nERROR:\nno such file\n</output>"),
        assistant(reply),
        user("<returncode>1</returncode>\n<output>\nERROR:\nno such file\n</output>"),
    ]
    ledger = _ledger(messages)
    # the same call with the same outcome is one entry
    assert ledger.trail == (
        "$ sed -n '100,140p' django/db/models/query.py → exit 1; ERROR: no such file",
    )
    assert ledger.requests == ("Fix the QuerySet bug",)  # the observation is not a request
    assert "100" not in ledger.values


def test_an_observation_whose_action_was_folded_earlier_still_counts() -> None:
    ledger = _ledger([user("<returncode>2</returncode>\n<output>\nfatal: not a repo\n</output>")])
    assert ledger.trail == ("(an earlier call) → exit 2; fatal: not a repo",)


def test_values_keep_their_context_and_skip_code() -> None:
    ledger = _ledger([user("Please use port 8080 for build abc123.\n```\nline 4242\n```")])
    assert ledger.values == ("use port 8080", "abc123")


def test_sections_fit_the_budget_and_return_the_overflow() -> None:
    ledger = Ledger(
        requests=tuple(f"request {i}" for i in range(50)),
        trail=tuple(f"$ make target_{i} → exit 0" for i in range(200)),
        files=tuple(f"src/module_{i}.py" for i in range(200)),
    )
    items = (MemoryItem("decision", "Use PostgreSQL 16"),)
    rendered = render_sections(ledger, items, estimator=ESTIMATOR, max_tokens=400)
    assert ESTIMATOR.count_text(rendered.text) <= 400
    assert "(decision) Use PostgreSQL 16" in rendered.text and rendered.left_out == ()
    assert "$ make target_199 → exit 0" in rendered.text  # the newest calls first when short
    assert "$ make target_0 → exit 0" in rendered.overflow.trail
    for name in ("requests", "trail", "files"):
        kept = [e for e in getattr(ledger, name) if e in rendered.text]
        assert len(kept) + len(getattr(rendered.overflow, name)) == len(getattr(ledger, name))


def test_rendered_sections_read_back_as_they_were() -> None:
    ledger = Ledger(
        requests=("Fix the bug in src/app.py",),
        trail=("$ pytest -q → exit 1; AssertionError: x", "get_user(id=7) → ok"),
        files=("src/app.py", "/etc/hosts"),
        values=("port 8080",),
    )
    items = (MemoryItem("preference", "Short answers"),)
    rendered = render_sections(ledger, items, estimator=ESTIMATOR, max_tokens=2000)
    task = render_task("The task\n## with a heading")
    body = f"The model's text.\n\n{task}\n\n{rendered.text}"
    back = read_body(body)
    assert back.lead == "The model's text."
    assert back.task == "The task\n## with a heading"
    assert back.ledger == ledger and back.items == items


def test_overflow_becomes_bounded_fact_items() -> None:
    overflow = Ledger(requests=("ask 1",), trail=tuple(f"$ cmd {i} → ok" for i in range(100)))
    items = overflow_items(overflow)
    assert all(i.type == "fact" and len(i.content) < 700 for i in items)
    assert all(is_overflow_item(i.content) for i in items)
    text = "\n".join(i.content for i in items)
    assert "ask 1" in text and all(f"$ cmd {i} → ok" in text for i in range(100))


def test_responses_call_items_each_keep_their_outcome() -> None:
    # Responses sends one item per call, then the outputs: call A, call B, output A, output B.
    items = [
        Item("assistant", calls=(ToolCall("a", "search_flights", '{"origin":"SFO"}'),), joins=True),
        Item("assistant", calls=(ToolCall("b", "get_user", '{"user_id":"u1"}'),), joins=True),
        Item("tool", text='{"flight_number":"HAT123"}', answers=("a",)),
        Item("tool", text='{"user_id":"mia_li_3668"}', answers=("b",)),
    ]
    trail = build_ledger(items, range(len(items))).trail
    assert trail == (
        "search_flights(origin=SFO) → ids: HAT123",
        "get_user(user_id=u1) → ids: mia_li_3668",
    )


def test_values_with_commas_in_their_context_read_back_whole() -> None:
    ledger = _ledger([user("We paid, roughly 12345 dollars, for order 99812 last week.")])
    assert ledger.values
    rendered = render_sections(ledger, (), estimator=ESTIMATOR, max_tokens=500)
    assert read_body(f"lead\n\n{rendered.text}").ledger.values == ledger.values
