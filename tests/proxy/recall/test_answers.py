"""What a recall call gets back when a result is longer than the room left: the lines that hold
the query's words, not the result's start."""

from __future__ import annotations

from proxy.recall.answers import Query, excerpt, render
from proxy.state.archive import Found, Kind


def _found(kind: Kind, index: int, text: str) -> Found:
    return Found(
        kind=kind, index=index, score=1.0, text=text, body=None, compaction_id="c1", at=0.0
    )


def _long_output(answer_line: int, lines: int = 2000) -> str:
    rows = [f"row {i}: status ok, nothing to report" for i in range(lines)]
    rows[answer_line] = "row 1742: deploy token rotated to ZETA-9931 by the nightly job"
    return "\n".join(rows)


def test_an_answer_deep_in_a_long_tool_output_reaches_the_model() -> None:
    found = [_found("tool_output", 12, _long_output(1742))]
    text = render(Query("deploy token rotated", None, 5), found, room_tokens=400)

    assert "ZETA-9931" in text
    assert "turn 12, tool output" in text
    assert len(text) <= 400 * 3
    assert "[...]" in text  # what was left out is marked, not silently joined


def test_the_lines_kept_are_in_their_order_with_a_line_of_context_each_side() -> None:
    text = "\n".join(["alpha", "one", "beta gamma", "two", "three", "four", "gamma", "five"])
    cut = excerpt(text, ["gamma", "beta"], budget=80)

    assert cut.split("\n") == [
        "[...]",
        "one",
        "beta gamma",
        "two",
        "[...]",
        "four",
        "gamma",
        "five",
    ]


def test_a_result_with_none_of_the_words_keeps_its_start() -> None:
    assert excerpt("abcdef\nghij", ["zzz"], budget=4) == "abcd"


def test_one_line_longer_than_the_room_is_cut_around_the_word() -> None:
    line = "x" * 5000 + " needle " + "y" * 5000
    cut = excerpt(line, ["needle"], budget=200)

    assert "needle" in cut
    assert len(cut) <= 200


def test_a_result_that_fits_is_given_whole() -> None:
    found = [_found("message", 3, "the cap is $500 without approval")]
    text = render(Query("cap", None, 5), found, room_tokens=1000)

    assert text.endswith("[1] turn 3, message:\nthe cap is $500 without approval")


def test_a_short_excerpt_is_still_an_answer_never_a_header_alone() -> None:
    # One short line holds the words in a long result: its excerpt is short, yet it is the
    # answer (issue 34: the header alone came back and the model could not answer).
    rows = ["ok"] * 3000
    rows[1500] = "cap: $500"
    found = [_found("tool_output", 7, "\n".join(rows))]
    text = render(Query("cap", None, 5), found, room_tokens=600)

    assert "$500" in text
    assert "[1] turn 7, tool output:" in text


def test_when_no_result_fits_the_answer_says_so() -> None:
    found = [_found("tool_output", 7, "x" * 5000)]
    text = render(Query("cap", None, 5), found, room_tokens=40)

    assert "best match first:" not in text
    assert "none fits" in text and "cap" in text


def test_results_left_out_for_room_are_said_to_be_left_out() -> None:
    found = [_found("message", i, f"the cap is ${i}00 " + "pad " * 300) for i in range(1, 4)]
    text = render(Query("cap", None, 5), found, room_tokens=500)

    assert "[1] turn 1, message:" in text
    assert "shown, the rest did not fit" in text
    assert len(text) <= 500 * 3
