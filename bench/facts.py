"""What a folded message held that the agent may need again: written apart from compaction/ledger.

The retention benchmark checks the library's ledger against these extractors, so they share no
code with it (not its scanners, not its patterns): a ledger that drifts would otherwise grade
itself. Each fact is a short string that must occur, whitespace collapsed, in what the agent
still has (the forwarded request or the memory file):

- paths: `path`-like tool arguments that look like paths, and path tokens of shell commands;
- commands: the first line of each shell command (a fenced bash block of mini-swe-agent, or a
  shell tool's `command`), first 60 characters;
- errors: the first error line of each tool result or shell observation, first 60 characters;
- ids: string values of `*id` / `*_number` keys in tool results and tool arguments;
- requests: the first 60 characters of each message the user wrote (tool observations sent as
  user messages, and mini-swe-agent's format reminders, are not requests).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

KINDS = ("paths", "commands", "errors", "ids", "requests")
KEY_CHARS = 60

_BASH_BLOCK = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.DOTALL)
_WORD_SPLIT = re.compile(r"[\s'\"`;|&<>(){}\[\],=]+")
_EXTENSION = re.compile(r"\.(?:py|pyi|js|ts|json|ya?ml|toml|md|txt|cfg|ini|sh|c|h|cpp|rs|go|rst)$")
_ERROR = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*(?:Error|Exception)\b.*\S.*|(?:error|fatal|ERROR):\s*\S.*)$",
    re.MULTILINE,
)
_ID_VALUE = re.compile(r'"(?:\w*_)?(?:id|number)"\s*:\s*"([^"\\]{3,60})"')
_SPACES = re.compile(r"\s+")
_OBSERVATION = ("<returncode>", "Please always provide EXACTLY ONE action")
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


def is_observation(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.lstrip().startswith(_OBSERVATION)


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
            found["ids"].update(_ID_VALUE.findall(json.dumps(arguments)))
        for command in commands:
            first = next((line for line in command.splitlines() if line.strip()), "")
            if first:
                found["commands"].add(flat(first)[:KEY_CHARS])
            found["paths"].update(_command_paths(command))
    elif role == "tool" or (role == "user" and is_observation(message)):
        error = _ERROR.search(content)
        if error:
            found["errors"].add(flat(error.group(0))[:KEY_CHARS])
        found["ids"].update(_ID_VALUE.findall(content))
    elif is_request(message) and (key := flat(content)[:KEY_CHARS]):
        found["requests"].add(key)
    return facts


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
