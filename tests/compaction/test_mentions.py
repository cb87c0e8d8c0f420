"""The whole-text scan finds, text by text, exactly what the per-text finders of scan.py find."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.corpus import read_corpus
from compaction import Compaction, Compactor
from compaction.mentions import _EXTENSION, MentionCache, Mentions, find_paths_each, scan_prose
from compaction.messages import Item, read_items
from compaction.scan import CODE_EXTENSIONS, find_paths, mentioned_values, strip_fences
from compaction.types import Message
from tests.compaction.conftest import ScriptedLLM
from tests.factories import assistant, system, user


def _one_by_one(texts: list[str]) -> list[Mentions]:
    return [(tuple(find_paths(strip_fences(t))), tuple(mentioned_values(t))) for t in texts]


def test_scan_prose_equals_the_per_text_finders_on_every_corpus_conversation(
    corpus_dir: Path,
) -> None:
    texts: list[str] = []
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in read_corpus(path):
            items = read_items(conversation["messages"])
            texts += [item.text for item in items if item.text]
    assert len(texts) > 10_000
    found = scan_prose(texts)
    assert found == _one_by_one(texts)
    assert sum(len(paths) for paths, _ in found) > 1000
    assert sum(len(values) for _, values in found) > 1000


_PIECES = st.sampled_from(
    [
        " ", "\n", "\t", ".", "/", "./", "~/", "a", "Z", "é", "7", "123", "4567", "-", "_", ":",
        "py", ".py", "src/app.py", "order", "#", "```", "```bash\n", "\u3000", "١٢٣", "x9", "<",
        ">", "=", ",", "(", ")", "\u00a0", "abc12", "v1.2.3", "http://x.io/a", "ab-", "-12ab",
    ]
)  # fmt: skip
_TEXTS = st.lists(st.lists(_PIECES, max_size=40).map("".join), max_size=8)


@settings(max_examples=400)
@given(_TEXTS)
def test_scan_prose_equals_the_per_text_finders_on_any_texts(texts: list[str]) -> None:
    assert scan_prose(texts) == _one_by_one(texts)


def test_digits_other_than_ascii_are_found_as_the_per_text_finders_find_them() -> None:
    # Words are found by a class of ASCII digits only when no text holds another digit.
    texts = ["order ١٢٣٤ please", "room ５６７ now", "plain text", "see v2.0 and 12345 too"]
    assert scan_prose(texts) == _one_by_one(texts)
    assert scan_prose(texts)[0][1] == ("order ١٢٣٤",)
    assert scan_prose(texts[1:])[0][1] == ("room ５６７",)


def test_the_cache_scans_each_text_once_and_answers_like_a_scan() -> None:
    cache = MentionCache()
    first = ["see src/app.py and order 12345", "id ab12cd34 here"]
    assert cache.scan(first) == scan_prose(first)
    assert cache.scanned == 2
    extended = [*first, "now /etc/hosts, ticket 98765"]
    assert cache.scan(extended) == scan_prose(extended)
    assert cache.scanned == 3


def test_the_cache_drops_the_least_recently_used_texts_beyond_its_size() -> None:
    cache = MentionCache(max_chars=20)
    cache.scan(["a" * 15])
    cache.scan(["b" * 15])
    cache.scan(["a" * 15])
    assert cache.scanned == 3


def test_the_cache_holds_no_more_than_its_size_even_of_the_texts_just_scanned() -> None:
    cache = MentionCache(max_chars=20)
    texts = ["order 12345 " + "c" * 10, "d" * 15]  # 37 characters in one call
    assert cache.scan(texts) == scan_prose(texts)
    assert cache.scan(texts[:1]) == scan_prose(texts[:1])  # let go at once: scanned again
    assert cache.scanned == 3
    # Held again it pushed the other out, and then went too: 22 characters alone are past 20.
    assert cache.scan(texts[1:]) == scan_prose(texts[1:])
    assert cache.scanned == 4


def _conversation(turns: int) -> list[Message]:
    messages: list[Message] = [system()]
    for turn in range(turns):
        messages.append(user(f"turn {turn}: please update src/module_{turn}.py for order {turn}00"))
        messages.append(assistant(f"Updated src/module_{turn}.py; ticket AB{turn}X9 noted. " * 8))
    return messages


async def test_a_longer_history_folds_again_scanning_only_its_new_messages() -> None:
    cache = MentionCache()
    compactor = Compactor(mentions=cache)
    short = _conversation(40)
    compaction = await compactor.prepare(short, window=4_000)
    plan = compaction.plan
    first = await compaction.run(llm=ScriptedLLM(), session_id=None)
    assert first.path == "llm"
    scanned = cache.scanned
    assert scanned == len(plan.folded)  # every folded message is prose: each scanned once

    longer = [*short, *_conversation(60)[len(short) :]]
    longer_compaction = await compactor.prepare(longer, window=4_000)
    longer_plan = longer_compaction.plan
    assert set(plan.folded) < set(longer_plan.folded)
    second = await longer_compaction.run(llm=ScriptedLLM(), session_id=None)
    assert second.path == "llm"
    assert cache.scanned - scanned == len(set(longer_plan.folded) - set(plan.folded))

    fresh = Compactor()
    again = await Compaction(fresh, longer, longer_plan).run(llm=ScriptedLLM(), session_id=None)
    assert again.summary_text == second.summary_text


_IGNORING_CASE = re.compile(
    r"\.(?:" + "|".join(sorted(CODE_EXTENSIONS, key=len, reverse=True)) + r")\b", re.IGNORECASE
)
_EXTENSION_TEXTS = st.lists(
    st.sampled_from(
        [
            *sorted(CODE_EXTENSIONS),
            ".",
            "a",
            "S",
            "ſ",
            "K",
            "\u212a",
            "İ",
            "ı",
            "_",
            " ",
            "/",
            "1",
            "é",
        ]
    ),
    max_size=12,
).map("".join)


@given(_EXTENSION_TEXTS)
def test_the_extension_tree_matches_where_the_ignorecase_alternation_does(text: str) -> None:
    found = [m.span() for m in _EXTENSION.finditer(text)]
    assert found == [m.span() for m in _IGNORING_CASE.finditer(text)]


def test_the_extension_tree_matches_every_extension_in_any_case() -> None:
    for extension in CODE_EXTENSIONS:
        for spelled in (extension, extension.upper(), extension.replace("s", "ſ")):
            assert _EXTENSION.fullmatch(f".{spelled}") and _IGNORING_CASE.fullmatch(f".{spelled}")


@given(_TEXTS)
def test_the_paths_of_many_commands_are_each_command_s_paths(texts: list[str]) -> None:
    assert find_paths_each(texts) == [tuple(find_paths(text)) for text in texts]


def test_the_paths_of_every_corpus_text_at_once_are_each_text_s_paths(
    corpus_items: list[Item],
) -> None:
    texts = [item.text for item in corpus_items]
    found = find_paths_each(texts)
    assert found == [tuple(find_paths(text)) for text in texts]
    assert sum(map(len, found)) > 1000
