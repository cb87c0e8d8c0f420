"""Ledgers: files, commands, errors, requests and values collected by code, bounded."""

from __future__ import annotations

from compaction import HeuristicEstimator, read_items
from compaction.ledger import Ledger, build_ledger, is_overflow_item, overflow_items, render_ledger
from tests.factories import assistant, assistant_calls, tool_call, tool_result, user

ESTIMATOR = HeuristicEstimator()


def _ledger(messages: list[dict[str, object]]) -> Ledger:
    return build_ledger(read_items(messages), range(len(messages)))


def test_files_and_commands_come_from_tool_call_arguments() -> None:
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
        tool_result(run["id"], "1 passed"),
    ]
    ledger = _ledger(messages)
    assert "/repo/src/app.py" in ledger.files
    assert "tests/test_app.py" in ledger.files and "/repo" in ledger.files
    assert ledger.commands == ("cd /repo && pytest tests/test_app.py -q",)
    assert "view" not in ledger.commands  # an editor sub-command is not a shell command


def test_mini_swe_fenced_bash_blocks_are_commands() -> None:
    reply = (
        "THOUGHT: look at the model.\n\n```bash\nsed -n '100,140p' django/db/models/query.py\n```"
    )
    messages = [
        user("Fix the QuerySet bug"),
        assistant(reply),
        user("<returncode>0</returncode><output>code</output>"),
    ]
    ledger = _ledger(messages)
    assert ledger.commands == ("sed -n '100,140p' django/db/models/query.py",)
    assert "django/db/models/query.py" in ledger.files
    assert ledger.requests == ("Fix the QuerySet bug",)  # the observation is not a request
    assert "100" not in ledger.values  # numbers inside code are noise


def test_error_lines_are_collected_from_tool_output_deduped() -> None:
    output = "Traceback (most recent call last):\n  File x\nValueError: bad input 42\n"
    call = tool_call()
    messages = [
        assistant_calls(call),
        tool_result(call["id"], output),
        user(
            "<returncode>1</returncode><output>ValueError: bad input 42\nerror: build failed</output>"
        ),
    ]
    ledger = _ledger(messages)
    assert ledger.errors == ("ValueError: bad input 42", "error: build failed</output>")


def test_requests_values_and_prose_paths() -> None:
    messages = [
        user("Please rename config/settings.yaml\nby Friday, ticket 4521"),
        assistant("I will edit `src/conf.py`, reservation ZFA04Y costs 1286 dollars."),
    ]
    ledger = _ledger(messages)
    assert ledger.requests == ("Please rename config/settings.yaml / by Friday, ticket 4521",)
    assert {"config/settings.yaml", "src/conf.py"} <= set(ledger.files)
    assert {"4521", "1286", "ZFA04Y"} <= set(ledger.values)


def test_ledger_is_bounded() -> None:
    messages = [assistant(f"```bash\necho {i}\n```") for i in range(2000)]
    ledger = _ledger(messages)
    assert len(ledger.commands) == 400 and ledger.commands[-1] == "echo 1999"


def test_render_fits_the_budget_and_returns_the_overflow() -> None:
    ledger = Ledger(
        requests=tuple(f"request {i}" for i in range(50)),
        files=tuple(f"src/file_{i}.py" for i in range(200)),
        commands=tuple(f"make target_{i}" for i in range(200)),
    )
    text, overflow = render_ledger(ledger, estimator=ESTIMATOR, max_tokens=300)
    assert ESTIMATOR.count_text(text) <= 300
    assert "src/file_0.py" in text and "`make target_0`" in text and "request 0" in text
    shown = [f for f in ledger.files if f in text]
    assert set(overflow.files) == set(ledger.files) - set(shown)
    assert overflow.files and overflow.commands


def test_everything_fits_under_a_large_budget() -> None:
    ledger = Ledger(files=("a/b.py",), commands=("ls",), errors=("E: x",), values=("123",))
    text, overflow = render_ledger(ledger, estimator=ESTIMATOR, max_tokens=1000)
    assert overflow.is_empty()
    for entry in ("a/b.py", "`ls`", "E: x", "123"):
        assert entry in text


def test_overflow_becomes_bounded_fact_items() -> None:
    overflow = Ledger(requests=("ignored",), files=tuple(f"pkg/m{i}.py" for i in range(100)))
    items = overflow_items(overflow)
    assert len(items) > 1 and all(i.type == "fact" and len(i.content) < 700 for i in items)
    joined = " ".join(i.content for i in items)
    assert all(f"pkg/m{i}.py" in joined for i in range(100)) and "ignored" not in joined
    assert all(is_overflow_item(i.content) for i in items)
