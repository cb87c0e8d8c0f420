"""What code can spot in the text of folded messages: paths, shell commands, errors, values.

Compiled regular expressions over whole texts (no loop per character); each finder returns its
hits in order, clipped to a readable length. The ledger decides which item each text comes from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from compaction.messages import ToolCall
from compaction.text import clip_end, collapse_spaces, is_collapsed

REQUEST_CHARS = 3000
"""A user request is listed whole up to this long (whitespace collapsed): what the person asked
is kept as they said it (a 2,555-character task given with `codex exec resume` was listed by its
first 300 characters, its last sentence nowhere); only a pasted text is clipped."""
COMMAND_CHARS = 160
ERROR_CHARS = 200
PATH_CHARS = 200

PATH_ARGUMENTS = frozenset(
    [
        "path",
        "file",
        "filename",
        "file_path",
        "filepath",
        "target_file",
        "source",
        "destination",
        "dir",
        "directory",
        "cwd",
        "old_path",
        "new_path",
    ]
)
"""Tool-call argument names whose string value is a path."""

SHELL_ARGUMENTS = ("command", "cmd", "script")
SHELL_TOOL_WORDS = ("bash", "shell", "exec", "terminal", "run", "command")
"""A tool whose name holds one of these words runs its `command` argument in a shell."""

CODE_EXTENSIONS = frozenset(
    [
        "py", "pyi", "pyx", "js", "mjs", "ts", "tsx", "jsx", "json", "yaml", "yml", "toml", "md",
        "rst", "txt", "cfg", "ini", "conf", "sh", "bash", "zsh", "c", "h", "cc", "cpp", "hpp", "rs",
        "go", "java", "kt", "rb", "php", "html", "css", "scss", "sql", "csv", "lock", "xml", "log",
        "diff", "patch", "ipynb", "env",
    ]
)  # fmt: skip

_EXTENSIONS = "|".join(sorted(CODE_EXTENSIONS, key=len, reverse=True))
_PART = r"[\w.+@-]+"
# One pass over the whole text finds the candidates; only the few hits are looked at in Python.
# A path is not glued to a word, a tag (`</pr_description>`), a URL or another path before it.
PATH_PATTERN = re.compile(
    rf"(?<![\w<>/.~$:%-])(?=[\w.+@~-]*[/.])"  # a word start, and a word with a slash or a dot
    rf"(?:(?:~|\.{{1,2}})?/{_PART}(?:/{_PART})*/?"  # absolute, ./ ../ ~/
    rf"|{_PART}(?:/{_PART})+/?"  # relative and nested
    rf"|[\w+@-][\w.+@-]*\.(?:{_EXTENSIONS})\b)"  # a file name with a known extension
    rf"(?![\w/:])",
    re.IGNORECASE,
)
_KNOWN_EXTENSION = re.compile(rf"\.(?:{_EXTENSIONS})$", re.IGNORECASE)
_PLACEHOLDER = re.compile(
    r"/path/to/|(?:^|/)(?:your|my|some)[_-]|\.\.\.|^/?(?:\w+_)?(?:description|example)$"
)
_HAS_LETTER = re.compile(r"[^\W\d_]")
PATH_TRAILING = ".:;,)"
# A fence runs to the next ``` (an unclosed one to the end, before a last newline, as `$`
# reads it): `.*?` written out as runs of other characters, each taken whole, where the lazy
# form tries the closing at every character (twice as slow over code blocks).
_FENCED_SHELL = re.compile(r"```(?:bash|sh|shell|console)[ \t]*\n([^`]*+(?:`(?!``)[^`]*+)*+)```")
_FENCE = re.compile(r"```[^`\n]*+(?:(?:\n(?!\Z)|`(?!``))[^`\n]*+)*+(?:```|$)")
_ERROR_LINE = re.compile(
    r"^[ \t]*(?:[\w.]*(?:Error|Exception)\b[^\n]*?\S[^\n]*"
    r"|(?:error|ERROR|fatal|panic):[ \t]*(?:\n[ \t]*)?\S[^\n]*)$",
    re.MULTILINE,
)
_LINE_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
"""Where `str.splitlines` breaks a line."""
_TRACEBACK_HEADER = "Traceback (most recent call last):"
# Frames are indented (`  File …`, the code, `^^^^` markers); the exception line is not.
_TRACEBACK_END = re.compile(
    re.escape(_TRACEBACK_HEADER) + r"[^\n]*\n(?:(?:[ \t\r][^\n]*)?\n)*(\S[^\n]*)"
)
_TAIL_CHARS = 4000
_PREFIXED_LINES = 2000  # of a traceback whose lines carry a prefix, the most read
_DECORATION = "=-*~"
_NOT_OUTPUT = re.compile(
    r"</?[\w-]+>$"  # a tag of the harness's own (`</output>`)
    r"|\S+@\S+:.*[#$]$"  # a shell prompt (`root@host:/repo #`)
    r"|\[?(?:Command finished with )?exit code[ :=]*-?\d+\]?$"
    r"|<returncode>",
    re.IGNORECASE,
)
# A number of three or more digits is shown with the words before it (or, opening a line, after
# it): "order 12345", never a bare 12345. The digits are found over the whole text; each hit looks
# only at a bounded slice around it, so no long run can make the scan quadratic.
# Digits inside a word (abc123, user_7287) are not wanted: a greedy run can only start at the
# start of its run of digits, so the run is dropped when a word character precedes it. Checked in
# Python on the few hits rather than by a lookbehind at every position of the text.
DIGITS_PATTERN = re.compile(r"\d\d\d+")  # not \d{3,}: opening with a class, it is searched for in C
_CONTEXT_CHARS = 130
_PUNCTUATION = ".,;:!?'\")"
IDENTIFIER_PATTERN = re.compile(r"\b(?=[A-Za-z_-]*\d)(?=[\d_-]*[A-Za-z])[A-Za-z0-9_-]{5,40}\b")


def looks_like_path(token: str) -> bool:
    """A file or directory path: absolute, relative with a dot, nested, or a known extension;
    never a URL, a placeholder (`/path/to/dir`) or a template tag."""
    return find_paths(token) == [token]


def find_paths(text: str) -> list[str]:
    """Path-looking tokens of `text` (shell commands or prose), in order, trailing punctuation cut."""
    # A path holds no whitespace, and whitespace next to one reads as the text's edge to every
    # assertion of PATH_PATTERN: the regex runs over only the words that can hold a path (a slash, or a
    # dot before their last character), split at C speed. Same hits, a fraction of the text.
    words = " ".join([word for word in text.split() if "/" in word or "." in word[:-1]])
    found: list[str] = []
    for raw in PATH_PATTERN.findall(words):
        token = raw.rstrip(PATH_TRAILING)
        if is_path_token(token):
            found.append(token)
    return found


def is_path_token(token: str) -> bool:
    if len(token) > PATH_CHARS or len(token) < 2 or not _HAS_LETTER.search(token):
        return False
    if _PLACEHOLDER.search(token):
        return False
    if token.startswith(("/", "./", "../", "~/")):
        return not token.startswith("//")
    return token.strip("/").count("/") >= 2 or bool(_KNOWN_EXTENSION.search(token))


def command_key(command: str) -> str:
    """A command as the ledger shows it: its first line, whitespace collapsed, clipped; " …"
    when more lines follow (a stripped command that breaks its line has more: its last
    character is no space). A heredoc script is not split into its lines for that."""
    stripped = command.strip()
    more = _LINE_BREAK.search(stripped)
    first = collapse_spaces(stripped[: more.start()] if more else stripped)
    if len(first) > COMMAND_CHARS:
        return clip_end(first, COMMAND_CHARS)
    return first + (" …" if more else "")


def is_shell_tool(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in SHELL_TOOL_WORDS)


# The quoted program of a text tool (`sed -n '/def f/,/c/p'`, `awk '/x/ {print}'`) is an
# expression, not a file: its slashes would read as paths (`/def`, `/c`).
_TEXT_PROGRAM = re.compile(
    r"""\b(sed|awk|gawk|grep|egrep|rg|perl)\b((?:\s+-[\w-]+(?:=\S+)?)*)\s+('[^']*'|"[^"]*")"""
    r"""|(\s-e\s+)('[^']*'|"[^"]*")"""
)


def without_programs(command: str) -> str:
    """`command` with the quoted programs of sed, awk, grep and perl left out (for finding the
    paths it names)."""
    if "'" not in command and '"' not in command:
        return command
    return _TEXT_PROGRAM.sub(lambda m: f"{m[1]}{m[2]} ''" if m[1] else f"{m[4]}''", command)


def call_commands_and_paths(call: ToolCall) -> tuple[list[str], list[str]]:
    arguments = call.parsed()
    commands: list[str] = []
    paths: list[str] = []
    for key, value in arguments.items():
        if not isinstance(value, str) or not value.strip():
            continue
        if key in PATH_ARGUMENTS and _is_argument_path(value.strip()):
            paths.append(value.strip())
        elif key in SHELL_ARGUMENTS and is_shell_tool(call.name or ""):
            commands.append(value)
            paths += find_paths(without_programs(value))
    return commands, paths


def _is_argument_path(value: str) -> bool:
    """A path argument's value, when it is one (an airport code under `destination` is not)."""
    if len(value) > PATH_CHARS or "\n" in value or not _HAS_LETTER.search(value):
        return False
    return "/" in value or bool(_KNOWN_EXTENSION.search(value))


def fenced_commands(text: str) -> list[str]:
    """Shell blocks an assistant wrote in its text (mini-swe-agent acts this way)."""
    return [block for block in _FENCED_SHELL.findall(text) if block.strip()]


def error_lines(text: str) -> list[str]:
    """Lines that report an error with something to say (a bare `ERROR:` takes the next line)."""
    return [clip_end(collapse_spaces(m), ERROR_CHARS) for m in _ERROR_LINE.findall(text)]


def first_error_line(text: str) -> str | None:
    found = _ERROR_LINE.search(text)
    return clip_end(collapse_spaces(found.group(0)), ERROR_CHARS) if found else None


def final_exception(text: str) -> str | None:
    """The exception that ended the last Python traceback of `text` (of a chained traceback, the
    one raised last, not its cause): the first unindented line after the last frames. A
    traceback whose header opens after a prefix (pytest's `INTERNALERROR> `) is read with that
    prefix taken off each of its lines."""
    start = text.rfind(_TRACEBACK_HEADER)
    if start < 0:
        return None
    prefix = text[text.rfind("\n", 0, start) + 1 : start]
    if prefix.strip():
        text, start = _without_prefix(text[start:], prefix), 0
    found = _TRACEBACK_END.match(text, start)
    return clip_end(collapse_spaces(found.group(1)), ERROR_CHARS) if found else None


def _without_prefix(traceback: str, prefix: str) -> str:
    """The lines of `traceback` that carry `prefix` (blank ones its bare form), up to the first
    that does not, with the prefix taken off."""
    bare = prefix.rstrip()
    lines: list[str] = []
    for line in traceback.split("\n", _PREFIXED_LINES)[1:]:
        if line.startswith(prefix):
            lines.append(line[len(prefix) :])
        elif line.rstrip() == bare:
            lines.append("")
        else:
            break
    return "\n".join([_TRACEBACK_HEADER, *lines, ""])


def last_output_line(text: str) -> str | None:
    """The last line a command printed that says something: blank lines, decoration (`=====`),
    lone tags (`</output>`), shell prompts and the exit status line are passed over. Only the
    tail is read, so a huge output costs no more than a short one."""
    lines = text[-_TAIL_CHARS:].splitlines()
    if len(text) > _TAIL_CHARS:
        lines = lines[1:]  # the tail may open inside a line
    for line in reversed(lines):
        stripped = line.strip().strip(_DECORATION).strip()
        if stripped and not _NOT_OUTPUT.match(stripped):
            return clip_end(collapse_spaces(stripped), ERROR_CHARS)
    return None


def strip_fences(text: str) -> str:
    """`text` with its fenced code blocks (an unclosed one runs to the end) made one space."""
    return _FENCE.sub(" ", text) if "```" in text else text


def mentioned_values(text: str) -> list[str]:
    """Numbers with the words around them ("order 12345", not a bare 12345) and identifiers
    mixing letters and digits, in prose; code blocks excluded (line numbers there are noise)."""
    prose = strip_fences(text)
    numbers = [
        number_in_context(prose, *found.span())
        for found in DIGITS_PATTERN.finditer(prose)
        if not is_after_word(prose, found.start())
    ]
    # As for paths: an identifier holds a digit and no whitespace, so only such words are read.
    words = " ".join([word for word in prose.split() if not word.rstrip(_PUNCTUATION).isalpha()])
    return [n for n in numbers if n] + IDENTIFIER_PATTERN.findall(words)


def is_after_word(text: str, at: int) -> bool:
    """True when a word character (what `\\w` matches: `isalnum` or `_`) precedes `text[at]`."""
    return at > 0 and (text[at - 1].isalnum() or text[at - 1] == "_")


def number_in_context(prose: str, start: int, end: int) -> str:
    """The number at prose[start:end] as its own token with the two words before it (after it,
    opening a line); "" when it stands alone. Bounded slices, split at C speed."""
    digits = prose[start:end]
    window = start - _CONTEXT_CHARS if start > _CONTEXT_CHARS else 0
    line = prose.rfind("\n", window, start) + 1
    # The words before it, split from the end: only the last three are ever shown (two, and
    # one glued to the number), so four splits tell them and whether more came before.
    before = prose[line or window : start].rsplit(maxsplit=4)
    if len(before) == 5:
        del before[:2]  # the first may be cut by the window (dropped below): not needed here
    elif not line and window and before:
        del before[0]  # the slice may open inside a word
    prefix = before.pop() if before and not prose[start - 1].isspace() else ""
    glued = end < len(prose) and not prose[end].isspace()
    if before and not glued:  # most numbers: the words after are not needed
        words = [*before[-2:], prefix + digits]
    else:
        # The words after it on its line: one glued to it, then two shown if none came before.
        stop = prose.find("\n", end, end + _CONTEXT_CHARS)
        after = prose[end : stop if stop >= 0 else end + _CONTEXT_CHARS].split(maxsplit=3)
        token = prefix + digits + (after.pop(0) if after and glued else "")
        words = [*before[-2:], token] if before else [token, *after[:2]]
    # ", " inside a value would split it when the ledger's inline list is read back.
    value = " ".join(words).replace(", ", " ").rstrip(".:,;/-")
    return "" if value == digits else value


def first_lines(text: str, limit: int = REQUEST_CHARS) -> str:
    """The opening of a request (its first `limit` * 4 characters), whitespace collapsed and
    clipped. A shorter slice collapsed begins the collapsed opening (its last word cut at
    most): when it is past the limit already, it is all that is shown."""
    head = collapse_spaces(text[: 2 * limit])
    if len(head) > limit or len(text) <= 2 * limit:
        return clip_end(head, limit)
    return clip_end(collapse_spaces(text[: limit * 4]), limit)


def first_lines_of(texts: Iterable[str], limit: int = REQUEST_CHARS) -> list[str]:
    """`first_lines` of each text; one within the limit with nothing to collapse is its own."""
    return [
        text if len(text) <= limit and is_collapsed(text) else first_lines(text, limit)
        for text in texts
    ]
