"""Verification: preserved keys, grades, and appending what is missing under a budget."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from compaction import MemoryItem
from compaction.messages import Item
from compaction.scan import first_lines
from compaction.verify import (
    PROBED_KEYS,
    TOKEN_OVERLAP,
    SummaryIndex,
    append_missing,
    ascii_key_tokens,
    byte_tokens,
    check_preserved,
    comparable,
    key_tokens,
    missing_items,
    narrow_key,
)


def test_all_preserved_is_good() -> None:
    summary = "Decided to use PostgreSQL 16. Edited `src/app.py`. Ran pytest -q."
    result = check_preserved(["src/app.py", "pytest -q", "decided to use postgresql 16"], summary)
    assert result.quality == "good"
    assert (result.key_decisions_preserved, result.key_decisions_total) == (3, 3)
    assert result.missing_key_info == ()


def test_key_token_overlap_counts_as_preserved() -> None:
    result = check_preserved(
        ["The user decided to use PostgreSQL version 16"],
        "Decision: PostgreSQL 16 chosen (user decided), version pinned, to use it",
    )
    assert result.key_decisions_preserved == 1


def test_grades_follow_the_preserved_ratio() -> None:
    keys = [f"file_{i}.py" for i in range(10)]

    def quality(kept: int) -> str:
        return check_preserved(keys, " ".join(keys[:kept])).quality

    assert (quality(10), quality(9), quality(8), quality(6), quality(5)) == (
        "good",
        "good",
        "acceptable",
        "acceptable",
        "poor",
    )


def test_missing_keys_are_listed_and_duplicates_counted_once() -> None:
    result = check_preserved(["a/b.py", "a/b.py", "c/d.py"], "a/b.py")
    assert result.missing_key_info == ("c/d.py",) and result.key_decisions_total == 2


def test_no_keys_is_good() -> None:
    assert check_preserved([], "anything").quality == "good"


def test_cjk_items_match_by_character_pairs() -> None:
    items = [
        MemoryItem("decision", "用户决定使用 React"),
        MemoryItem("fact", "截止日期是三月十五日"),
    ]
    assert missing_items(items, "摘要：用户决定使用 React。") == [items[1]]


def test_append_missing_adds_what_fits_only() -> None:
    items = [MemoryItem("todo", "Add an index"), MemoryItem("fact", "x" * 500)]
    text = append_missing("Summary.", items, fits=lambda t: len(t) < 200)
    assert text.startswith("Summary.\n\n## Also preserved\n- (todo) Add an index")
    assert "xxx" not in text
    assert append_missing("Summary.", [], fits=lambda t: True) == "Summary."


def _as_bytes(tokens: set[str]) -> set[bytes]:
    return {token.encode("ascii") for token in tokens}


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=200))
def test_ascii_key_tokens_are_the_regex_tokens_on_any_ascii_text(text: str) -> None:
    assert ascii_key_tokens(text) == _as_bytes(key_tokens(text))


def test_ascii_key_tokens_are_the_regex_tokens_on_every_corpus_request(
    corpus_items: list[Item],
) -> None:
    compared = 0
    for item in corpus_items:
        for text in (item.text, first_lines(item.text)):
            if text.isascii():
                assert ascii_key_tokens(text) == _as_bytes(key_tokens(text))
                compared += 1
    assert compared > 10_000


def _reference_contains(key: str, summary: str) -> bool:
    """The definition `SummaryIndex.contains` implements (module docstring), spelled out."""
    wanted = comparable(key)
    if not wanted or wanted in comparable(summary):
        return True
    tokens = key_tokens(key)
    return bool(tokens) and len(tokens & key_tokens(summary)) >= TOKEN_OVERLAP * len(tokens)


_MIXED_TEXT = st.text(
    alphabet=st.sampled_from(list("aZ7_ -.`\n") + list("…’—é東京ßKͅ①٣")), max_size=60
)


@given(_MIXED_TEXT)
@example("abc\u0345")  # a combining mark (not a letter) that casefolds to iota (a letter)
def test_a_narrow_key_has_the_key_tokens(text: str) -> None:
    narrow = narrow_key(text)
    if narrow is not None:
        assert {token.decode() for token in byte_tokens(narrow)} == key_tokens(text)


def test_english_punctuation_keeps_a_key_narrow() -> None:
    assert narrow_key("It’s done — mostly…") is not None
    assert narrow_key("naïve café") is None


@given(_MIXED_TEXT, _MIXED_TEXT, st.sampled_from([1, PROBED_KEYS]))
@example("a1 1 abc xyz", "abc 1", 1)  # "a1" counts as the "1" the key has: 2 of 3 tokens
@example("b2 abc xyz", "abc 2", 1)  # "b2" counts as "2": 2 of 3 tokens
def test_contains_is_the_definition(key: str, summary: str, keys: int) -> None:
    assert SummaryIndex(summary, keys=keys).contains(key) == _reference_contains(key, summary)


def test_contains_is_the_definition_on_corpus_requests(corpus_items: list[Item]) -> None:
    """Keys are folded requests; each summary quotes some of them whole, some in part, and
    mixes in others' words, so all three ways of being found (and missing) occur."""
    texts = [item.text for item in corpus_items if item.is_request and item.text.strip()]
    # Keys of short words only have no tokens: only their text can be found.
    shorts = [s for t in texts if len(s := " ".join(w for w in t.split() if len(w) < 3)) > 40]
    keys = [k for pair in zip(texts[::7][:3000], shorts, strict=False) for k in pair]
    found = 0
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        summary = "\n".join(
            [*chunk[::5], *(k[: len(k) // 2] for k in chunk[1::5]), *(k[::-1] for k in chunk[2::5])]
        )
        index = SummaryIndex(summary, keys=len(chunk))
        for key in chunk:
            expected = _reference_contains(key, summary)
            assert index.contains(key) == expected, key
            found += expected
    assert 0 < found < len(keys)
