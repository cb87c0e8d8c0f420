"""`number_in_context` splits the words after a number only when it needs them: the same values
as the version that always split them, on every number of the corpus and on any text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compaction.messages import Item
from compaction.scan import DIGITS_PATTERN, number_in_context, strip_fences

_CONTEXT_CHARS = 130


def _always_splitting(prose: str, start: int, end: int) -> str:
    """number_in_context as it was: both sides split for every number."""
    line = prose.rfind("\n", max(0, start - _CONTEXT_CHARS), start) + 1
    before = prose[line or max(0, start - _CONTEXT_CHARS) : start].split()
    if not line and start > _CONTEXT_CHARS and before:
        before = before[1:]
    stop = prose.find("\n", end, end + _CONTEXT_CHARS)
    after = prose[end : stop if stop >= 0 else end + _CONTEXT_CHARS].split(maxsplit=3)[:3]
    prefix = before.pop() if before and not prose[start - 1].isspace() else ""
    suffix = after.pop(0) if after and end < len(prose) and not prose[end].isspace() else ""
    token = prefix + prose[start:end] + suffix
    words = [*before[-2:], token] if before else [token, *after[:2]]
    value = " ".join(words).replace(", ", " ").rstrip(".:,;/-")
    return "" if value == prose[start:end] else value


def _both(prose: str) -> tuple[list[str], list[str]]:
    spans = [found.span() for found in DIGITS_PATTERN.finditer(prose)]
    return [number_in_context(prose, *s) for s in spans], [
        _always_splitting(prose, *s) for s in spans
    ]


def test_number_context_equals_the_always_splitting_version_on_the_corpus(
    corpus_items: list[Item],
) -> None:
    numbers = 0
    for item in corpus_items:
        found, expected = _both(strip_fences(item.text))
        assert found == expected
        numbers += len(found)
    assert numbers > 10_000


_PIECES = st.sampled_from(
    [
        "123",
        "4567",
        " ",
        "\n",
        "\t",
        "a",
        "word",
        "-",
        ".",
        ",",
        ", ",
        "(",
        ")",
        "é",
        "\u3000",
        "x" * 140,
    ]
)


@given(st.lists(_PIECES, max_size=30).map("".join))
def test_number_context_equals_the_always_splitting_version_on_any_text(prose: str) -> None:
    found, expected = _both(prose)
    assert found == expected
