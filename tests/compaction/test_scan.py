"""The scanners: paths, commands, error lines and values spotted in text."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from compaction.messages import Item
from compaction.scan import (
    REQUEST_CHARS,
    command_key,
    error_lines,
    fenced_commands,
    find_paths,
    first_lines,
    first_lines_of,
    mentioned_values,
    strip_fences,
)
from compaction.text import clip_end, collapse_spaces


def test_find_paths_ignores_urls_fractions_and_plain_words() -> None:
    assert find_paths("see https://x.org/a/b.py and/or 1/2 or foo.bar") == []
    assert find_paths("cat ./run.sh /etc/hosts a/b/c main.py") == [
        "./run.sh",
        "/etc/hosts",
        "a/b/c",
        "main.py",
    ]


def test_command_key_is_first_line_collapsed_and_clipped() -> None:
    assert command_key("cat  <<'EOF' > x.py\nprint(1)\nEOF") == "cat <<'EOF' > x.py …"
    assert len(command_key("echo " + "a" * 500)) == 160


def test_error_lines_are_clipped_and_values_skip_code_blocks() -> None:
    text = "ok\nValueError: " + "x" * 500 + "\nfine"
    assert error_lines(text) == ["ValueError: " + "x" * 187 + "…"]
    prose = "Port 8080 and build abc123 ```\nline 4242\n```"
    assert mentioned_values(prose) == ["Port 8080", "abc123"]  # a number keeps its context
    assert "4242" not in strip_fences(prose)


def test_find_paths_skips_tags_placeholders_and_codes() -> None:
    text = "<pr_description>fix</pr_description> in /path/to/working/dir, see src/app.py and IAH"
    assert find_paths(text) == ["src/app.py"]


def test_bare_error_markers_take_the_next_line_or_are_skipped() -> None:
    assert error_lines("OBSERVATION:\nERROR:\nThe `view_range` parameter is not allowed.") == [
        "ERROR: The `view_range` parameter is not allowed."
    ]
    assert error_lines("ERROR:\n\n") == []


_LAZY_FENCE = re.compile(r"```.*?(?:```|$)", re.DOTALL)
_LAZY_SHELL = re.compile(r"```(?:bash|sh|shell|console)[ \t]*\n(.*?)```", re.DOTALL)
_FENCED = st.lists(
    st.sampled_from(["`", "``", "```", "\n", "a", " ", "\t", "x\n", "```bash\n", "```sh \n"]),
    max_size=14,
).map("".join)


@given(_FENCED)
def test_fences_are_found_as_the_lazy_patterns_find_them(text: str) -> None:
    """The fence patterns are `.*?` written out for speed: the same blocks, unclosed ones too."""
    assert strip_fences(text) == (_LAZY_FENCE.sub(" ", text) if "```" in text else text)
    assert fenced_commands(text) == [b for b in _LAZY_SHELL.findall(text) if b.strip()]


_REQUESTS = st.lists(
    st.lists(
        st.sampled_from(
            ["a", "word", " ", "  ", "\n", "\t", "\xa0", "\u3000", "\r", "é", "x" * 120]
        ),
        max_size=12,
    ).map("".join),
    max_size=6,
)


@given(_REQUESTS)
@example(["a  b", " a", "a ", "a\tb", "a\xa0b", "a\u3000b", "a\nb", "x" * 301, "ok then"])
def test_first_lines_of_many_texts_are_each_text_s_first_lines(texts: list[str]) -> None:
    assert first_lines_of(texts) == [first_lines(text) for text in texts]


def _command_key_by_lines(command: str) -> str:
    """command_key as it was: every line split out to count them."""
    lines = [line for line in command.strip().splitlines() if line.strip()]
    first = collapse_spaces(lines[0]) if lines else ""
    if len(first) > 160:
        return clip_end(first, 160)
    return first + (" …" if len(lines) > 1 else "")


def _first_lines_whole(text: str) -> str:
    """first_lines as it was: the whole opening collapsed."""
    return clip_end(collapse_spaces(text[: 4 * REQUEST_CHARS]), REQUEST_CHARS)


_LINES = st.lists(
    st.sampled_from(
        ["ls", "cat <<'EOF' > a.py", " ", "  ", "\n", "\r\n", "\r", "\x0b", "\x1c", "\x1f", "\u2028",
         "\xa0", "\t", "x" * 70, "word " * 30, "é", "y " * 400]
    ),
    max_size=40,
).map("".join)  # fmt: skip


@given(_LINES)
@example("a\x1fb")
@example("echo hi\n\n  \n")
def test_command_keys_and_first_lines_are_what_splitting_every_line_gave(text: str) -> None:
    assert command_key(text) == _command_key_by_lines(text)
    assert first_lines(text) == _first_lines_whole(text)


def test_command_keys_and_first_lines_of_the_corpus_are_what_splitting_every_line_gave(
    corpus_items: list[Item],
) -> None:
    texts = [item.text for item in corpus_items]
    commands = [command for text in texts for command in fenced_commands(text)]
    assert len(commands) > 1000
    assert [command_key(c) for c in commands] == [_command_key_by_lines(c) for c in commands]
    assert [first_lines(t) for t in texts] == [_first_lines_whole(t) for t in texts]
