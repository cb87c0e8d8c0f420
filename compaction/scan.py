"""What code can spot in the text of folded messages: paths, shell commands, errors, values.

Compiled regular expressions over whole texts (no loop per character); each finder returns its
hits in order, clipped to a readable length. The ledger decides which item each text comes from.
"""

from __future__ import annotations

import re

from compaction.messages import ToolCall
from compaction.text import clip_end, collapse_spaces

REQUEST_CHARS = 300
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
        "py",
        "pyi",
        "pyx",
        "js",
        "mjs",
        "ts",
        "tsx",
        "jsx",
        "json",
        "yaml",
        "yml",
        "toml",
        "md",
        "rst",
        "txt",
        "cfg",
        "ini",
        "conf",
        "sh",
        "bash",
        "zsh",
        "c",
        "h",
        "cc",
        "cpp",
        "hpp",
        "rs",
        "go",
        "java",
        "kt",
        "rb",
        "php",
        "html",
        "css",
        "scss",
        "sql",
        "csv",
        "lock",
        "xml",
        "log",
        "diff",
        "patch",
        "ipynb",
        "env",
    ]
)

_TOKEN_SPLIT = re.compile(r"[\s'\"`;|&<>(){}\[\],=*!?]+")
_TRAILING = ".:;,)"
_FENCED_SHELL = re.compile(r"```(?:bash|sh|shell|console)[ \t]*\n(.*?)```", re.DOTALL)
_FENCE = re.compile(r"```.*?(?:```|$)", re.DOTALL)
_ERROR_LINE = re.compile(
    r"^\s*(?:[\w.]*(?:Error|Exception)\b|error:|ERROR\b|FAILED\b|fatal:|panic:|E\s{3})"
)
_NUMBER = re.compile(r"\b\d{3,}\b")
_IDENTIFIER = re.compile(r"\b(?=[A-Za-z_-]*\d)(?=[\d_-]*[A-Za-z])[A-Za-z0-9_-]{5,40}\b")


def looks_like_path(token: str) -> bool:
    """A file or directory path: absolute, relative with a dot, nested, or a known extension."""
    if "://" in token or not any(ch.isalpha() for ch in token) or len(token) > PATH_CHARS:
        return False
    if token.startswith(("/", "./", "../", "~/")):
        return len(token) > 1 and not token.startswith("//")
    _, dot, extension = token.rpartition(".")
    has_extension = bool(dot) and extension.lower() in CODE_EXTENSIONS
    inner = token.strip("/").count("/")
    return has_extension or inner >= 2


def find_paths(text: str) -> list[str]:
    """Path-looking tokens of `text` (shell commands or prose), in order, trailing punctuation cut."""
    found: list[str] = []
    for raw in _TOKEN_SPLIT.split(text):
        token = raw.rstrip(_TRAILING)
        if token and looks_like_path(token):
            found.append(token)
    return found


def command_key(command: str) -> str:
    """A command as the ledger shows it: its first line, whitespace collapsed, clipped."""
    lines = [line for line in command.strip().splitlines() if line.strip()]
    first = collapse_spaces(lines[0]) if lines else ""
    if len(first) > COMMAND_CHARS:
        return clip_end(first, COMMAND_CHARS)
    return first + (" …" if len(lines) > 1 else "")


def is_shell_tool(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in SHELL_TOOL_WORDS)


def call_commands_and_paths(call: ToolCall) -> tuple[list[str], list[str]]:
    arguments = call.parsed()
    commands: list[str] = []
    paths: list[str] = []
    for key, value in arguments.items():
        if not isinstance(value, str) or not value.strip():
            continue
        if key in PATH_ARGUMENTS and len(value) <= PATH_CHARS:
            paths.append(value.strip())
        elif key in SHELL_ARGUMENTS and is_shell_tool(call.name or ""):
            commands.append(value)
            paths += find_paths(value)
    return commands, paths


def fenced_commands(text: str) -> list[str]:
    """Shell blocks an assistant wrote in its text (mini-swe-agent acts this way)."""
    return [block for block in _FENCED_SHELL.findall(text) if block.strip()]


def error_lines(text: str) -> list[str]:
    return [
        clip_end(line.strip(), ERROR_CHARS) for line in text.splitlines() if _ERROR_LINE.match(line)
    ]


def strip_fences(text: str) -> str:
    """`text` with its fenced code blocks (an unclosed one runs to the end) made one space."""
    return _FENCE.sub(" ", text)


def mentioned_values(text: str) -> list[str]:
    """Numbers and identifiers in prose, code blocks excluded (line numbers there are noise)."""
    prose = strip_fences(text)
    return _NUMBER.findall(prose) + _IDENTIFIER.findall(prose)


def first_lines(text: str, limit: int = REQUEST_CHARS) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return clip_end(" / ".join(lines[:2]), limit) if lines else ""
