"""The retention benchmark's own fact extractors (bench/facts.py) and its count
(bench/retention.py) on small hand-made messages."""

from __future__ import annotations

import json

from bench.facts import KINDS, facts_of, is_request
from bench.forwarding import Forwarder
from bench.retention import Tally, _measure, replay, request_ends
from tests import factories as f

TRACEBACK = """<returncode>1</returncode>
<output>
Traceback (most recent call last):
  File "/testbed/app.py", line 3, in <module>
    run()
sqlite3.OperationalError: no such table: book

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/testbed/app.py", line 5, in <module>
    raise
django.db.utils.OperationalError: no such table: book
</output>"""


def test_a_traceback_yields_the_exception_that_closes_it() -> None:
    errors = facts_of({"role": "user", "content": TRACEBACK}).by_kind["errors"]
    assert errors == {"django.db.utils.OperationalError: no such table: book"}


def test_a_traceback_behind_a_line_prefix_yields_its_exception_not_a_closing_tag() -> None:
    output = (
        "<returncode>3</returncode>\n<output_tail>\n"
        "INTERNALERROR> Traceback (most recent call last):\n"
        'INTERNALERROR>   File "xdist/dsession.py", line 209, in worker_errordown\n'
        "INTERNALERROR>     self._active_nodes.remove(node)\n"
        "INTERNALERROR> KeyError: <WorkerController gw1>\n\n"
        "=== 2 failed in 0.66s ===\n\n</output_tail>"
    )
    errors = facts_of({"role": "user", "content": output}).by_kind["errors"]
    assert errors == {"KeyError: <WorkerController gw1>"}


def test_a_failed_command_yields_its_last_printed_line() -> None:
    output = (
        "<returncode>1</returncode>\n<output>\n/usr/bin/python3: No module named pytest\n</output>"
    )
    assert facts_of({"role": "tool", "content": output}).by_kind["errors"] == {
        "/usr/bin/python3: No module named pytest"
    }
    openhands = "ls: cannot access 'tests': No such file\nroot@host:/work\n[Command finished with exit code 2]"
    assert facts_of({"role": "tool", "content": openhands}).by_kind["errors"] == {
        "ls: cannot access 'tests': No such file"
    }


def test_a_successful_command_yields_no_error_even_when_a_line_mentions_one() -> None:
    output = "<returncode>0</returncode>\n<output>\nValueError: handled and printed\n</output>"
    assert facts_of({"role": "user", "content": output}).by_kind["errors"] == set()


def test_a_result_labelled_as_an_error_yields_its_message() -> None:
    tau = {"role": "tool", "content": "Error: not enough seats on flight HAT290"}
    editor = {"role": "tool", "content": "OBSERVATION:\nERROR:\nInvalid `view_range`: [0, 40]."}
    assert facts_of(tau).by_kind["errors"] == {"Error: not enough seats on flight HAT290"}
    assert facts_of(editor).by_kind["errors"] == {"Invalid `view_range`: [0, 40]."}


def test_ids_are_id_like_values_of_parsed_json_whatever_their_key() -> None:
    result = {"user_id": "mia_li_3668", "reservations": ["N6F783"], "date": "2024-05-15", "n": 7}
    facts = facts_of({"role": "tool", "content": json.dumps(result)})
    assert facts.by_kind["ids"] == {"mia_li_3668", "N6F783"}
    assert facts_of({"role": "tool", "content": "user mia_li_3668 is here"}).by_kind["ids"] == set()


def test_harness_messages_are_not_requests() -> None:
    observation = {"role": "user", "content": "<returncode>0</returncode>\n<output>\n</output>"}
    reminder = {
        "role": "user",
        "content": "Please reply with one action.\n\n<response_example>\n```bash\n<action>\n```\n"
        "</response_example>",
    }
    task = {"role": "user", "content": "<pr_description>\nFix the parser.\n</pr_description>"}
    assert not is_request(observation) and not is_request(reminder)
    assert is_request(task)


def test_retention_counts_every_fact_shown_and_loses_only_folded_ones_out_of_sight() -> None:
    messages = [
        {"role": "user", "content": "Fix the parser in src/parse.py please"},
        {"role": "assistant", "content": "```bash\ncat src/parse.py\n```"},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>ok</output>"},
        {"role": "assistant", "content": "```bash\nsed -n 1,5p lib/lexer.py\n```"},
    ]
    facts = [facts_of(m) for m in messages]
    shown = {kind: set().union(*(f.by_kind[kind] for f in facts)) for kind in KINDS}
    assert shown["paths"] == {"src/parse.py", "lib/lexer.py"}
    tally = Tally()
    # The first three were folded; the summary kept src/parse.py, and the fourth is in view.
    _measure(facts, shown, [0, 1, 2], "summary: src/parse.py ... sed -n 1,5p lib/lexer.py", tally)
    assert (tally.kept["paths"], tally.total["paths"]) == (2, 2)
    assert (tally.kept["commands"], tally.total["commands"]) == (1, 2)  # `cat src/parse.py` lost
    assert (tally.kept["requests"], tally.total["requests"]) == (0, 1)


async def test_a_replay_counts_what_was_shown_at_every_request_from_the_first_compaction() -> None:
    messages = f.simple_conversation(40, words=60)
    tally = await replay({"id": "c", "messages": messages}, 2_000, lossy=False, strategy="summary")
    ends = request_ends(messages)
    assert tally.compactions >= 2 and tally.requests == len(ends)
    forwarder = Forwarder(messages, seed=b"retention", window=2_000, llm=None, strategy="summary")
    sent = [await forwarder.forward(end) for end in ends]
    first = next(i for i, s in enumerate(sent) if s.result is not None)
    # The requests shown so far, at each request from the first compaction on: all of them,
    # not only the folded ones.
    shown = [sum(map(is_request, messages[:end])) for end in ends[first:]]
    assert tally.total["requests"] == sum(shown) > 0
    assert tally.kept["requests"] == tally.total["requests"]  # the summary lists every request
