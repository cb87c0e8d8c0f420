"""What a folded message held that the agent may need again: written apart from compaction/ledger.

The retention benchmark checks the library's ledger against these extractors, so they share no
code with it (not its scanners, not its patterns): a ledger that drifts would otherwise grade
itself. Each fact is a short string that must occur, whitespace collapsed, in what the agent
still has (the forwarded request or the memory file):

- paths: `path`-like tool arguments that look like paths, and path tokens of shell commands;
- commands: the first line of each shell command (a fenced bash block of mini-swe-agent, or a
  shell tool's `command`), first 60 characters;
- errors: what a failed tool said, judged by its outcome rather than by the look of a line:
  the exception line that closes a Python traceback; else, for a shell command with a non-zero
  exit status, the last line it printed; else the message of a result labelled `Error:`;
  first 60 characters;
- ids: id-like string values (letters and digits, no spaces) anywhere in a tool result or tool
  arguments that parse as JSON, whatever their key;
- requests: the first 60 characters of each message the user wrote. Not requests: a user
  message that opens with an exit status in markup (a shell observation sent back as a user
  message), and one that shows the agent an empty reply template (a format reminder).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

KINDS = ("paths", "commands", "errors", "ids", "requests")
KEY_CHARS = 60

_BASH_BLOCK = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.DOTALL)
_WORD_SPLIT = re.compile(r"[\s'\"`;|&<>(){}\[\],=]+")
_EXTENSION = re.compile(r"\.(?:py|pyi|js|ts|json|ya?ml|toml|md|txt|cfg|ini|sh|c|h|cpp|rs|go|rst)$")
_SPACES = re.compile(r"\s+")
_OPENING_ELEMENT = re.compile(r"\s*<([A-Za-z_][\w-]*)>\s*(-?\d+)\s*</\1>")
_EXIT_MARKER = re.compile(r"\[[^\[\]\n]*exit code (-?\d+)\]\s*$")
_OUTPUT_ELEMENT = re.compile(r"<output>\n?(.*?)</output>", re.DOTALL)
_PLACEHOLDER_FENCE = re.compile(r"```\w*\n\s*<[\w ]+>\s*\n```")
_TRACEBACK = "Traceback (most recent call last):"
_DECORATION = "=-_*# \t"
_PATH_KEYS = frozenset({"path", "file", "filename", "file_path", "filepath", "dir", "directory"})


def flat(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _is_path(token: str) -> bool:
    if not token or token.startswith("-") or "://" in token or not re.search("[A-Za-z]", token):
        return False
    if token.startswith(("/", "./", "../", "~/")):
        return len(token) > 2
    return "/" in token.strip("/") or bool(_EXTENSION.search(token))


def _command_paths(command: str) -> set[str]:
    return {t.rstrip(".:,") for t in _WORD_SPLIT.split(command) if _is_path(t.rstrip(".:,"))}


def _calls(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    raw = message.get("tool_calls")
    for call in raw if isinstance(raw, list) else []:
        try:
            name = call["function"]["name"]
            arguments = json.loads(call["function"]["arguments"])
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(arguments, dict):
            found.append((name, arguments))
    return found


def _exit_status(text: str) -> int | None:
    """The exit status a shell observation reports: an opening markup element holding only a
    number (mini-swe-agent's `<returncode>`), or a closing `[... exit code N]` (OpenHands)."""
    found = _OPENING_ELEMENT.match(text) or _EXIT_MARKER.search(text)
    return int(found.group(2 if found.re is _OPENING_ELEMENT else 1)) if found else None


def is_observation(message: dict[str, Any]) -> bool:
    """A user message the harness wrote: a command's output (it opens with an exit status) or
    a format reminder (it shows the agent an empty reply template to fill in)."""
    content = message.get("content")
    if not isinstance(content, str):
        return False
    return bool(_OPENING_ELEMENT.match(content) or _PLACEHOLDER_FENCE.search(content))


def is_request(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "user"
        and isinstance(message.get("content"), str)
        and not is_observation(message)
        and not message["content"].startswith("[compaction-proxy:")
    )


@dataclass
class Facts:
    by_kind: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})


def facts_of(message: Any) -> Facts:
    """The facts one original message holds."""
    facts = Facts()
    if not isinstance(message, dict):
        return facts
    found = facts.by_kind
    role = message.get("role")
    content = message.get("content") if isinstance(message.get("content"), str) else ""
    if role == "assistant":
        commands = _BASH_BLOCK.findall(content)
        for name, arguments in _calls(message):
            for key, value in arguments.items():
                if not isinstance(value, str) or not value.strip():
                    continue
                if key in _PATH_KEYS and _is_path(value.strip()):
                    found["paths"].add(value.strip())
                if key == "command" and "bash" in name:
                    commands.append(value)
            found["ids"].update(_id_like_values(arguments))
        for command in commands:
            first = next((line for line in command.splitlines() if line.strip()), "")
            if first:
                found["commands"].add(flat(first)[:KEY_CHARS])
            found["paths"].update(_command_paths(command))
    elif role == "tool" or (role == "user" and is_observation(message)):
        error = _failure(content)
        if error:
            found["errors"].add(flat(error)[:KEY_CHARS])
        # Prose or shell output does not parse: its ids are not told apart from other words.
        with contextlib.suppress(ValueError):
            found["ids"].update(_id_like_values(json.loads(content)))
    elif is_request(message) and (key := flat(content)[:KEY_CHARS]):
        found["requests"].add(key)
    return facts


def _failure(text: str) -> str:
    """What a failed tool said, "" when it did not fail: judged by the outcome (a traceback, a
    non-zero exit status, a result labelled as an error), not by the look of any one line."""
    if _TRACEBACK in text:
        at = text.rindex(_TRACEBACK)
        opening = text[text.rfind("\n", 0, at) + 1 : at]
        return _exception_line(text[at + len(_TRACEBACK) :], opening)
    status = _exit_status(text)
    if status is not None:
        return _last_line(_printed(text)) if status != 0 else ""
    return _labelled_error(text)


def _exception_line(frames: str, opening: str = "") -> str:
    """The exception that closes a traceback: the first unindented line after its frames shaped
    as Python prints one, `package.Name: message` or a bare `Name` (no spaces before a colon,
    no markup tag). A traceback printed with `opening` before every line (pytest's
    `INTERNALERROR> `) is read without it, and ends where its lines stop carrying it."""
    for line in frames.splitlines()[1 if opening.strip() else 0 :]:
        if opening.strip():
            if not line.startswith(opening.rstrip()):
                return ""
            line = line[len(opening) :]
        head = line.partition(":")[0]
        if line.strip() and not line[0].isspace() and head and " " not in head:
            return "" if head.startswith("<") else line
    return ""


def _printed(text: str) -> str:
    """What the command printed, without the harness's envelope around it."""
    inside = _OUTPUT_ELEMENT.search(text)
    if inside:
        return inside.group(1)
    return _EXIT_MARKER.sub("", text)


def _last_line(text: str) -> str:
    """The last line with words in it: not a lone markup tag (`</output_tail>`), not a shell
    prompt (`root@host:/path`), without decoration (`=== 1 failed in 0.2s ===`)."""
    for line in reversed(text.splitlines()):
        line = line.strip(_DECORATION)
        is_tag = line.startswith("<") and line.endswith(">") and " " not in line
        is_prompt = "@" in line.partition(":")[0] and " " not in line
        if line and not is_tag and not is_prompt:
            return line
    return ""


def _labelled_error(text: str) -> str:
    """The message of a result whose opening label lines (`Word:` or `Word: message`, as in
    `OBSERVATION:` then `ERROR:` then the message, or `Error: flight not available`) include an
    error label."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        label, colon, rest = line.partition(":")
        if not colon or not label.isalpha():
            return ""
        if label.lower() == "error":
            return line if rest.strip() else next(iter(lines[index + 1 :]), "")
    return ""


def _id_like_values(value: object) -> set[str]:
    """String values anywhere in parsed JSON that look like identifiers: letters and digits
    together (`HAT123`, `mia_li_3668`), nothing but `_` and `-` besides, 3 to 60 characters."""
    found: set[str] = set()
    if isinstance(value, dict | list):
        for inner in value.values() if isinstance(value, dict) else value:
            found |= _id_like_values(inner)
    elif isinstance(value, str) and 3 <= len(value) <= 60:
        shape_ok = all(c.isalnum() or c in "_-" for c in value)
        if shape_ok and any(c.isalpha() for c in value) and any(c.isdigit() for c in value):
            found.add(value)
    return found


def task_words(message: dict[str, Any]) -> set[str]:
    """Distinctive words of the task's opening: most must survive for the task to be present."""
    return set(re.findall(r"[A-Za-z_]{5,}", message["content"][:1000]))


def visible_text(messages: list[Any]) -> str:
    """Everything the upstream model reads in `messages`, whitespace collapsed."""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        for _, arguments in _calls(message):
            parts += [v for v in arguments.values() if isinstance(v, str)]
    return flat("\n".join(parts))


def pairing_is_valid(messages: list[Any]) -> bool:
    """Every tool message answers a pending call of the assistant before it, and every call is
    answered before the next non-tool message."""
    pending: set[str] = set()
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return False
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            return False
        if role == "assistant":
            pending = {c.get("id") for c in message.get("tool_calls") or []}
    return not pending
