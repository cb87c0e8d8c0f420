"""Every corpus conversation through the Compactor at small windows: valid output, and how much of
what the folded span held survives in summary plus memory.

What is measured, from the folded messages only:
- paths: string values of `path`/`file`/`filename`/`file_path` tool arguments, and path-looking
  tokens of shell commands (absolute or ./ ../ ~/ relative, or with two inner slashes, or ending
  in a common source-file extension);
- commands: each shell command (a shell tool's `command` argument, or a fenced bash block in
  assistant text), as its first line with whitespace collapsed, first 60 characters;
- numbers: runs of three or more digits in what the user wrote (not tool output, including
  mini-swe-agent's `<returncode>` observations) and in assistant prose outside code fences.
An entry is retained when it occurs in the summary text or in a memory item of that compaction.
The scripted summarizer answers a short generic text, so retention comes from the ledgers.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.corpus import read_corpus
from compaction import CompactionSettings, Compactor, is_summary_message
from compaction.invariants import check_compacted, check_tool_pairing
from tests.compaction.conftest import ScriptedLLM

WINDOWS = (4_000, 16_000)
MAX_PER_FILE = 200
"""Conversations per file (evenly spaced, first and last included); 200 covers the whole corpus."""

_SPLIT = re.compile(r"[\s'\"`;|&<>(){}\[\],=*!?]+")
_EXTENSIONS = {
    "py",
    "js",
    "ts",
    "json",
    "yaml",
    "yml",
    "toml",
    "md",
    "txt",
    "cfg",
    "sh",
    "c",
    "h",
    "rs",
    "go",
    "java",
    "html",
    "css",
    "sql",
    "ini",
    "rst",
}
_FENCED_BASH = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.DOTALL)
_FENCE = re.compile(r"```.*?(?:```|$)", re.DOTALL)
_NUMBER = re.compile(r"\b\d{3,}\b")
_PATH_KEYS = ("path", "file", "filename", "file_path")


def _is_path(token: str) -> bool:
    if "://" in token or not re.search(r"[A-Za-z]", token) or len(token) > 200:
        return False
    if token.startswith(("/", "./", "../", "~/")):
        return len(token) > 1 and not token.startswith("//")
    extension = token.rsplit(".", 1)[-1].lower() if "." in token else ""
    return extension in _EXTENSIONS or token.strip("/").count("/") >= 2


def _calls(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(arguments, dict):
            found.append((call["function"]["name"], arguments))
    return found


@dataclass
class Expected:
    paths: set[str] = field(default_factory=set)
    commands: set[str] = field(default_factory=set)
    numbers: set[str] = field(default_factory=set)


def expected_from(messages: list[Any], indices: list[int]) -> Expected:
    want = Expected()
    for i in indices:
        message = messages[i]
        if not isinstance(message, dict) or is_summary_message(message):
            continue
        content = message.get("content") if isinstance(message.get("content"), str) else ""
        commands: list[str] = []
        if message.get("role") == "assistant":
            commands += _FENCED_BASH.findall(content)
            for name, arguments in _calls(message):
                want.paths.update(
                    v.strip()
                    for k, v in arguments.items()
                    if k in _PATH_KEYS and isinstance(v, str) and v.strip() and len(v) <= 200
                )
                if "bash" in name and isinstance(arguments.get("command"), str):
                    commands.append(arguments["command"])
            want.numbers.update(_NUMBER.findall(_FENCE.sub(" ", content)))
        elif message.get("role") == "user" and not content.lstrip().startswith("<returncode>"):
            want.numbers.update(_NUMBER.findall(_FENCE.sub(" ", content)))
        for command in commands:
            lines = [line for line in command.strip().splitlines() if line.strip()]
            if lines:
                want.commands.add(" ".join(lines[0].split())[:60])
            want.paths.update(
                t.rstrip(".:;,)") for t in _SPLIT.split(command) if _is_path(t.rstrip(".:;,)"))
            )
    return want


@dataclass
class Tally:
    runs: int = 0
    compacted: int = 0
    not_fitting: int = 0
    found: dict[str, int] = field(default_factory=lambda: {"paths": 0, "commands": 0, "numbers": 0})
    in_summary: dict[str, int] = field(
        default_factory=lambda: {"paths": 0, "commands": 0, "numbers": 0}
    )
    total: dict[str, int] = field(default_factory=lambda: {"paths": 0, "commands": 0, "numbers": 0})

    def ratio(self, kind: str, counts: dict[str, int] | None = None) -> float:
        counts = self.found if counts is None else counts
        return counts[kind] / self.total[kind] if self.total[kind] else 1.0

    def add(self, other: Tally) -> None:
        self.runs += other.runs
        self.compacted += other.compacted
        self.not_fitting += other.not_fitting
        for kind in self.total:
            self.total[kind] += other.total[kind]
            self.found[kind] += other.found[kind]
            self.in_summary[kind] += other.in_summary[kind]

    def row(self, name: str) -> str:
        kinds = ("paths", "commands", "numbers")
        both = " ".join(f"{self.ratio(k):6.1%}" for k in kinds)
        alone = " ".join(f"{self.ratio(k, self.in_summary):6.1%}" for k in kinds)
        return f"{name:<48} {self.runs:4} {self.compacted:5} {self.not_fitting:5}  {both}   {alone}"


def _sample(conversations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(conversations) <= MAX_PER_FILE:
        return conversations
    step = (len(conversations) - 1) / (MAX_PER_FILE - 1)
    return [conversations[round(k * step)] for k in range(MAX_PER_FILE)]


async def _measure(
    conversation: dict[str, Any], window: int, llm: ScriptedLLM | None, tally: Tally
) -> None:
    messages, tools = conversation["messages"], conversation.get("tools") or None
    # What the summary and memory keep of the folded span: the summary strategy (previews fold
    # nothing; tests/compaction/test_selective.py covers them).
    compactor = Compactor(settings=CompactionSettings(llm_timeout_s=5, strategy="summary"))
    tally.runs += 1
    if not compactor.needs_compaction(compactor.estimate(messages, tools), window):
        return
    compaction = await compactor.prepare(messages, window=window, tools=tools)
    plan = compaction.plan
    result = await compaction.run(llm=llm, session_id=None)
    assert "internal error" not in result.reason, (conversation["id"], result.errors)
    assert check_tool_pairing(result.messages) == [], conversation["id"]
    if result.path == "unchanged":
        assert result.messages is messages
        return
    tally.compacted += 1
    assert check_compacted(messages, result.messages, plan) == [], conversation["id"]
    if result.fits:
        assert result.tokens_after <= window, conversation["id"]
    else:
        tally.not_fitting += 1
    want = expected_from(messages, list(plan.folded))
    everything = "\n".join([result.summary_text, *(i.content for i in result.memory_items)])
    for kind, entries in (
        ("paths", want.paths),
        ("commands", want.commands),
        ("numbers", want.numbers),
    ):
        tally.total[kind] += len(entries)
        tally.found[kind] += _count_present(kind, entries, everything)
        tally.in_summary[kind] += _count_present(kind, entries, result.summary_text)


def _count_present(kind: str, entries: set[str], haystack: str) -> int:
    if kind == "paths":
        return sum(1 for e in entries if e in haystack)
    if kind == "commands":
        flat = " ".join(haystack.split())
        return sum(1 for e in entries if e in flat)
    numbers = set(_NUMBER.findall(haystack))
    return len(entries & numbers)


@pytest.mark.timeout(120)
def test_corpus_compacts_validly_and_retains_paths_commands_numbers(corpus_dir: Path) -> None:
    started = time.perf_counter()
    files = sorted(corpus_dir.glob("*.jsonl"))
    assert files
    tallies: dict[str, Tally] = {}
    for path in files:
        conversations = _sample(list(read_corpus(path)))
        for window in WINDOWS:
            for mode, llm in (
                (
                    "scripted",
                    ScriptedLLM(
                        summary="Summary of the earlier work: the agent "
                        "investigated the task and made progress."
                    ),
                ),
                ("no-llm", None),
            ):
                tally = tallies.setdefault(f"{path.stem} {window // 1000}k {mode}", Tally())
                for conversation in conversations:
                    asyncio.run(_measure(conversation, window, llm, tally))
    overall = Tally()
    print()
    print(f"{'':<48} {'':16}  {'summary + memory':<20}   summary alone")
    print(
        f"{'corpus file, window, summarizer':<48} runs  done !fits  paths   cmds   nums    paths   cmds   nums"
    )
    for name, tally in tallies.items():
        print(tally.row(name))
        overall.add(tally)
    print(overall.row("overall"))
    print(f"entries: {overall.total}; {time.perf_counter() - started:.1f} s")
    assert overall.compacted > 0
    assert overall.ratio("paths") >= 0.95
    assert overall.ratio("commands") >= 0.90
    assert overall.ratio("numbers") >= 0.90
