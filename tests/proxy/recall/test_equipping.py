"""The room a request leaves its recall results (proxy.recall.equipping.recall_room)."""

from __future__ import annotations

from proxy.recall.equipping import recall_room


def test_a_roomy_request_leaves_results_the_window_to_the_fill_ratio_less_the_output() -> None:
    # 0.95 of 8000, less the request, less the guessed output (an eighth of the window).
    assert recall_room(8000, 4000, None) == 7600 - 4000 - 1000


def test_a_request_at_the_trigger_still_leaves_results_a_sixteenth_of_the_window() -> None:
    # The rule above gives nothing; half of the guessed output and the fill margin give 500.
    assert recall_room(8000, 6880, None) == 500
    # What the window still holds past half the guessed output, when that is less.
    assert recall_room(8000, 7300, None) == 200
    assert recall_room(8000, 7900, None) == 0


def test_an_output_bound_the_client_set_is_never_taken_from() -> None:
    assert recall_room(8000, 6880, 1100) == 8000 - 6880 - 1100
    assert recall_room(8000, 6000, 2500) == 0
