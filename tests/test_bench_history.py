"""The benchmarks' conversations (bench/history.py): unique messages whose markers the fold's
scanners find nothing in, so what a benchmark measures is the work on the corpus's text."""

from __future__ import annotations

from bench.history import history
from compaction.mentions import scan_prose


def test_every_message_is_unique_and_its_marker_adds_no_mention() -> None:
    messages = history(20_000, tag="c4-")[1:]
    texts = [message["content"] for message in messages]
    assert len(set(texts)) == len(texts)
    assert len(texts) > 100  # turn numbers of three digits and more are written too
    bare = [text.split("] ", 1)[1] for text in texts]
    # A number near a message's start reads the marker as its words before: the same findings,
    # one of them worded differently.
    assert _counts(scan_prose(texts)) == _counts(scan_prose(bare))


def _counts(mentions: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> list[tuple[int, int]]:
    return [(len(paths), len(values)) for paths, values in mentions]


def test_tags_that_differ_give_different_markers() -> None:
    first = history(2_000, tag="a1-")[1]["content"].split("] ", 1)[0]
    second = history(2_000, tag="a2-")[1]["content"].split("] ", 1)[0]
    assert first != second
