"""Clipping, normalizing and CJK detection shared by the library."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.text import (
    CJK_LETTER,
    clip_end,
    clip_middle,
    collapse_spaces,
    is_cjk_dominant,
    normalize,
)
from tests.factories import CJK_SAMPLE


def test_clip_middle_keeps_head_and_tail_and_says_how_much_went() -> None:
    text = "A" * 500 + "B" * 500
    clipped = clip_middle(text, 100)
    assert clipped.startswith("A") and clipped.endswith("B")
    assert "[… 900 chars omitted …]" in clipped
    assert clip_middle("short", 100) == "short"


def test_clip_end_marks_the_cut_and_keeps_the_limit() -> None:
    assert clip_end("abcdef", 4) == "abc…"
    assert len(clip_end("x" * 500, 100)) == 100
    assert clip_end("abc", 3) == "abc"


def test_normalize_ignores_spacing_and_case() -> None:
    assert normalize("  Use\tPOSTGRES\n now ") == "use postgres now"
    assert collapse_spaces(" a \n\n b ") == "a b"


_SPACED = st.text(alphabet=st.sampled_from(list(" \t\n\x1f\x85\xa0\u2028\u3000aZ.é\x7fßİ")))


@given(_SPACED)
def test_collapse_spaces_and_normalize_are_their_definitions(text: str) -> None:
    """The shortcut for texts with nothing to collapse, and lowering for casefolding ASCII,
    change nothing."""
    assert collapse_spaces(text) == " ".join(text.split())
    assert normalize(text) == " ".join(text.split()).casefold()


def test_every_whitespace_character_but_the_space_is_unprintable() -> None:
    """What collapse_spaces's shortcut rests on, over all of Unicode."""
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert [c for c in spaces if c.isprintable()] == [" "]


def test_cjk_dominance_counts_letters_not_punctuation() -> None:
    assert is_cjk_dominant([CJK_SAMPLE])
    assert is_cjk_dominant(["한국어 문장입니다 ok"])
    assert not is_cjk_dominant(["plain English text, 。。。"])
    assert not is_cjk_dominant([""])


def _cjk_dominant_by_definition(texts: list[str]) -> bool:
    cjk = sum(len(CJK_LETTER.findall(text)) for text in texts)
    letters = sum(1 for text in texts for ch in text if ch.isalpha())
    return letters > 0 and cjk * 4 >= letters


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(
        st.text(alphabet=st.sampled_from("ab Z1.,\n_é中文한ぁ。「ß٣Ω🙂"), max_size=40), max_size=5
    )
)
def test_the_fast_cjk_count_agrees_with_its_definition(texts: list[str]) -> None:
    assert is_cjk_dominant(texts) == _cjk_dominant_by_definition(texts)


@pytest.mark.parametrize("cjk", [1, 300, 2000])
@pytest.mark.parametrize("spread", [1, 7, 40])
def test_long_texts_near_the_quarter_agree_with_the_definition(cjk: int, spread: int) -> None:
    """Past the first slice of ASCII text that the fast count reads before the rest."""
    for letters in range(3 * cjk - 2, 3 * cjk + 3):
        english = (("a" + " " * spread) * letters)[: letters * (spread + 1)]
        texts = [english, "中" * cjk + "é"]
        assert is_cjk_dominant(texts) == _cjk_dominant_by_definition(texts)
        texts = [" " * (16 * cjk + 5000) + english, "中" * cjk]
        assert is_cjk_dominant(texts) == _cjk_dominant_by_definition(texts)
