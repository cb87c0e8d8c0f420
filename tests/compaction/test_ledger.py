"""Ledgers: requests, the tool trail, files and values collected by code; sections read back."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from compaction import HeuristicEstimator, MemoryItem, read_items
from compaction.ledger import Ledger, _chunks, build_ledger, is_overflow_item, overflow_items
from compaction.marker import PREVIEW_MARK, told_outcome
from compaction.messages import Item, ToolCall
from compaction.sections import read_body, render_sections, render_task
from compaction.selective import preview_text
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
    # what the user wrote: the sentence it came in (the numbers alone say little)
    assert ledger.values == ("Please use port 8080 for build abc123.",)
    ledger = _ledger([assistant("Port 8080 is free; build abc123 passed.")])
    assert ledger.values == ("Port 8080", "abc123")  # the assistant's: the words beside them


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
    ledger = _ledger([user("Thanks. We paid, roughly 12345 dollars, for order 99812 last week.")])
    assert ledger.values
    rendered = render_sections(ledger, (), estimator=ESTIMATOR, max_tokens=500)
    assert read_body(f"lead\n\n{rendered.text}").ledger.values == ledger.values


def test_a_preview_folded_later_keeps_the_outcome_of_its_whole_output() -> None:
    # The preview's own last line is its mark: read as an output it would say "ok" and lose
    # the last line the command printed.
    whole = (
        "<returncode>1</returncode>\n<output>\n"
        + "collected 2 items\n" * 200
        + "=== 2 failed in 0.04s ===\n</output>"
    )
    assert told_outcome(whole) is None
    preview = preview_text(whole)
    assert told_outcome(preview) == "exit 1; 2 failed in 0.04s"
    assert (
        _ledger([user(whole)]).trail
        == _ledger([user(preview)]).trail
        == ("(an earlier call) → exit 1; 2 failed in 0.04s",)
    )
    listing = "src/app.py\n" * 400
    assert told_outcome(preview_text(listing)) == "ok"
    # A turn of several previews (Anthropic tool_result blocks) tells what each of them told.
    assert told_outcome(preview_text(listing) + "\n" + preview) == "exit 1; 2 failed in 0.04s"


def test_an_output_that_only_quotes_the_preview_mark_keeps_its_own_outcome() -> None:
    # A search through this library's code prints the mark: that output is no preview.
    found = (
        "<returncode>1</returncode>\n<output>\n"
        f'compaction/marker.py:42:PREVIEW_MARK = "{PREVIEW_MARK}"\n'
        "ValueError: boom\n</output>"
    )
    assert told_outcome(found) is None
    assert _ledger([user(found)]).trail == ("(an earlier call) → exit 1; ValueError: boom",)


def test_a_failed_command_keeps_the_last_line_it_printed() -> None:
    # No line reads as an error: the message is the last thing the command printed.
    observation = (
        "<returncode>127</returncode>\n<output>\nbash: line 1: pytest: command not found\n</output>"
    )
    ledger = _ledger([user(observation)])
    assert ledger.trail == (
        "(an earlier call) → exit 127; bash: line 1: pytest: command not found",
    )


def test_the_last_line_skips_prompts_banners_and_the_exit_line() -> None:
    call = tool_call(name="execute_bash", arguments={"command": "python -m pytest -q"})
    result = (
        "collected 3 items\r\n\r\n===== 1 failed, 2 passed in 0.12s =====\r\n"
        "root@workspace:/repo # \n[Command finished with exit code 1]"
    )
    ledger = _ledger([assistant_calls(call), tool_result(call["id"], result)])
    assert ledger.trail == ("$ python -m pytest -q → exit 1; 1 failed, 2 passed in 0.12s",)


def test_a_successful_command_does_not_show_its_last_line() -> None:
    ledger = _ledger([user("<returncode>0</returncode>\n<output>\nall good\n</output>")])
    assert ledger.trail == ("(an earlier call) → exit 0",)


def test_a_chained_traceback_keeps_the_exception_that_ended_the_run() -> None:
    output = (
        "Traceback (most recent call last):\n"
        '  File "db.py", line 3, in execute\n'
        "    return cursor.execute(sql)\n"
        "sqlite3.OperationalError: no such table: book\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "run.py", line 9, in <module>\n'
        "    main()\n"
        "    ^^^^^^\n"
        "django.db.utils.OperationalError: no such table: book\n"
    )
    ledger = _ledger([user(f"<returncode>1</returncode>\n<output>\n{output}</output>")])
    assert ledger.trail == (
        "(an earlier call) → exit 1; django.db.utils.OperationalError: no such table: book",
    )


def test_an_exception_not_named_error_closes_its_traceback() -> None:
    output = (
        "Traceback (most recent call last):\n"
        '  File "s.py", line 2, in <module>\n'
        "    next(iter([]))\n"
        "StopIteration\n"
    )
    ledger = _ledger([user(f"<returncode>0</returncode>\n<output>\n{output}</output>")])
    assert ledger.trail == ("(an earlier call) → exit 0; StopIteration",)


# pytest prints an internal error's traceback with a prefix on every line.
INTERNAL_ERROR = (
    "replacing crashed worker gw1\n"
    "INTERNALERROR> Traceback (most recent call last):\n"
    'INTERNALERROR>   File "/testbed/src/_pytest/main.py", line 191, in wrap_session\n'
    "INTERNALERROR>     session.exitstatus = doit(config, session) or 0\n"
    "INTERNALERROR>\n"
    'INTERNALERROR>   File "xdist/dsession.py", line 209, in worker_errordown\n'
    "INTERNALERROR>     self._active_nodes.remove(node)\n"
    "INTERNALERROR> KeyError: <WorkerController gw1>\n\n"
    "============================== 2 failed in 0.66s ===============================\n"
)


def test_a_traceback_behind_a_line_prefix_keeps_its_exception() -> None:
    ledger = _ledger(
        [user(f"<returncode>3</returncode>\n<output_tail>\n{INTERNAL_ERROR}</output_tail>")]
    )
    assert ledger.trail == (
        "(an earlier call) → exit 3; KeyError: <WorkerController gw1>; 2 failed in 0.66s",
    )


def test_an_error_line_and_a_different_last_line_are_both_kept() -> None:
    output = "error: could not build wheel\nnote: see the log above\nbuild failed after 3 steps\n"
    ledger = _ledger([user(f"<returncode>2</returncode>\n<output>\n{output}</output>")])
    assert ledger.trail == (
        "(an earlier call) → exit 2; error: could not build wheel; build failed after 3 steps",
    )


def test_the_last_line_of_a_huge_output_is_found_from_its_tail() -> None:
    output = "x" * 50_000 + "\n" + "line\n" * 20_000 + "ls: cannot access 'nope': No such file\n"
    ledger = _ledger([user(f"<returncode>2</returncode>\n<output>\n{output}</output>")])
    assert ledger.trail == ("(an earlier call) → exit 2; ls: cannot access 'nope': No such file",)


def _chunks_one_by_one(entries: Sequence[str], limit: int) -> list[list[str]]:
    """The overflow runs as they were cut before: one step per entry."""
    chunks: list[list[str]] = []
    chunk: list[str] = []
    size = 0
    for entry in entries:
        if chunk and size + len(entry) > limit:
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(entry)
        size += len(entry) + 3
    if chunk:
        chunks.append(chunk)
    return chunks


@given(st.lists(st.text(max_size=90), max_size=60), st.integers(min_value=0, max_value=300))
def test_overflow_runs_are_cut_as_one_step_per_entry_cuts_them(
    entries: list[str], limit: int
) -> None:
    assert [list(c) for c in _chunks(tuple(entries), limit)] == _chunks_one_by_one(entries, limit)


def test_the_programs_of_sed_awk_and_grep_are_not_files() -> None:
    commands = [
        "sed -n '/def serialize/,/return/p' django/db/migrations/writer.py",
        "sed -i 's/old_name/new_name/g' src/app/models.py",
        "awk '/^class /{print NR}' src/app/views.py",
        'grep -n "c/d" src/app/urls.py',
    ]
    calls = [tool_call(arguments={"command": command}) for command in commands]
    messages = [assistant_calls(*calls)] + [tool_result(c["id"]) for c in calls]
    assert _ledger(messages).files == (
        "django/db/migrations/writer.py",
        "src/app/models.py",
        "src/app/views.py",
        "src/app/urls.py",
    )


def test_a_failed_test_is_named_in_its_calls_outcome() -> None:
    unittest = tool_call(arguments={"command": "python tests/runtests.py migrations"})
    pytest_run = tool_call(arguments={"command": "pytest tests/test_app.py"})
    unittest_output = (
        "F.\n======\nFAIL: test_serialize_enums (migrations.test_writer.WriterTests)\n"
        "------\nAssertionError: 'a' != 'b'\n\nFAILED (failures=1)"
    )
    pytest_output = (
        "tests/test_app.py .F\n=== short test summary info ===\n"
        "FAILED tests/test_app.py::test_login - assert 401 == 200\n1 failed, 1 passed"
    )
    ledger = _ledger(
        [
            assistant_calls(unittest, pytest_run),
            tool_result(unittest["id"], unittest_output),
            tool_result(pytest_run["id"], pytest_output),
        ]
    )
    assert "failed: test_serialize_enums (migrations.test_writer.WriterTests)" in ledger.trail[0]
    assert "failed: tests/test_app.py::test_login" in ledger.trail[1]


def test_line_numbers_are_no_values_shown_to_the_model() -> None:
    ledger = _ledger([assistant("See Lines 1414-1419.\nWait, line 1412 is it.\nThe order 77123.")])
    rendered = render_sections(ledger, (), estimator=ESTIMATOR, max_tokens=500)
    assert "order 77123" in rendered.text and "141" not in rendered.text
    assert any("1414" in value for value in rendered.overflow.values)  # the memory file has them
