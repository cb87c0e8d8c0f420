"""The scanners: paths, commands, error lines and values spotted in text."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from compaction.scan import (
    command_key,
    error_lines,
    fenced_commands,
    find_paths,
    first_lines,
    first_lines_of,
    mentioned_values,
    strip_fences,
)


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
