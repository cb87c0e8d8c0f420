"""bench.recall in a small configuration, so its figure cannot rot silently: the kit's canaries of
one session grown 4 windows at 8k through the proxy, asked whole and streamed in each dialect; at
least 99% answered right with recall, every recall result the model read carries content (never
a header line alone), and no recall call ever reaches the client. The same
questions without recall (the figure beside it) stay below."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fake_model import Turns, decide, key_terms
from bench.recall import Results, has_content, measure, parse, share
from bench.recall import build_cases as build

OFFERED = [(dialect, stream) for dialect in ("chat", "responses", "anthropic")
           for stream in (False, True)]  # fmt: skip


@pytest.mark.timeout(150)  # ~15 s alone; a loaded CI machine takes several times that
async def test_a_small_recall_bench_answers_at_least_99_percent_with_recall(
    corpus_dir: Path,
) -> None:
    args = parse(["--seeds", "1", "--sessions", "random", "--per-source", "0"])
    results = Results()
    cases = build(args, results)
    (case,) = cases
    case.questions = case.questions[:12]
    assert len(case.questions) == 12
    await measure(cases, ["chat", "responses", "anthropic"], args.window, results)

    for dialect, stream in OFFERED:
        on = results.answered[dialect, stream, "on"]
        assert share(on) >= 99.0, (dialect, stream, [a.answer for a in on if not a.right])
        assert sum(a.rounds for a in on) > 0
        read = [result for a in on for result in a.results]
        assert read and all(map(has_content, read)), (dialect, stream, read)
    every = [a for answers in results.answered.values() for a in answers]
    assert not any(a.leaked for a in every)
    off = [a for (_, _, recall), answers in results.answered.items() if recall == "off"
           for a in answers]  # fmt: skip
    assert share(off) < 99.0


def test_the_model_calls_recall_only_when_no_line_of_its_context_holds_the_key_terms() -> None:
    question = "What is the budget cap and the rule for exceeding it?"
    assert key_terms(question) == ["budget", "cap", "rule", "exceeding"]
    held = Turns(question, ["HARD RULE: Budget cap is $500; never exceed it."], None, True)
    assert decide(held) == ("HARD RULE: Budget cap is $500; never exceed it.", None)
    missing = Turns(question, ["We talked about the weather."], None, True)
    assert decide(missing) == ("", "budget cap rule exceeding")
    recalled = "1 earlier result(s) for 'budget cap rule exceeding':\n[1] turn 4, message:\n"
    recalled += "Rule: the budget cap is $500, never exceeding it."
    answered = Turns(question, ["We talked about the weather."], recalled, True)
    assert decide(answered) == ("Rule: the budget cap is $500, never exceeding it.", None)


def test_the_model_reads_a_recalled_line_holding_the_terms_in_order_and_skips_the_header() -> None:
    # The line answering "check some classical" quotes the terms in order: it is the answer,
    # not the result's header echoing the query (which the model skips).
    question = "What did the earlier tool output say about check some classical?"
    recalled = "1 earlier result(s) for 'check some classical', best match first:\n"
    recalled += "[1] turn 43, tool output:\n    81\t    # check some classical latin symbols\n"
    recalled += "    90\t    # check some arabic"
    answered = Turns(question, ["We talked about the weather."], recalled, True)
    assert decide(answered) == ("    81\t    # check some classical latin symbols", None)


def test_a_recall_result_of_its_header_alone_has_no_content() -> None:
    header = "5 earlier result(s) for 'budget cap', best match first:"
    assert not has_content(header)
    assert not has_content(header + "\n\n")
    assert has_content(header + "\n\n[1] turn 3, tool output:\nthe cap is 40")
    assert has_content("Nothing earlier matches 'budget cap'. Try other key words.")
