"""Fixtures for the compaction tests: a scripted ChatLLM passed in through constructors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.corpus import read_corpus
from compaction import MemoryWriter
from compaction.messages import Item, read_items
from compaction.types import Message, Purpose

Reply = str | BaseException | Callable[[list[Message]], Awaitable[str]]


@dataclass
class Call:
    messages: list[Message]
    purpose: Purpose
    max_tokens: int


@dataclass
class ScriptedLLM:
    """A ChatLLM answering each purpose from a script and recording every request.

    A reply is a string, an exception to raise, or an async function of the request.
    """

    summary: Reply = "Goals: keep the build green. Decisions: none. Current state: in progress."
    memory: Reply = "[]"
    calls: list[Call] = field(default_factory=list)

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        self.calls.append(Call(messages, purpose, max_tokens))
        reply = self.summary if purpose == "summary" else self.memory
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            return await reply(messages)
        return reply

    def requests(self, purpose: Purpose) -> list[list[Message]]:
        return [c.messages for c in self.calls if c.purpose == purpose]


async def sleep_forever(_messages: list[Message]) -> str:
    await asyncio.sleep(3600)
    return "never"


def memory_reply(*items: tuple[str, str]) -> str:
    return json.dumps([{"type": t, "content": c} for t, c in items])


@pytest.fixture
def llm() -> ScriptedLLM:
    return ScriptedLLM()


@pytest.fixture
def memory_dir(tmp_path: Path) -> Path:
    return tmp_path / "memory"


@pytest.fixture
def writer(memory_dir: Path) -> MemoryWriter:
    return MemoryWriter(memory_dir)


def text_of(messages: list[Any]) -> str:
    return "\n".join(str(m.get("content")) for m in messages if isinstance(m, dict))


@pytest.fixture(scope="session")
def corpus_items(corpus_dir: Path) -> list[Item]:
    """Every message of every corpus conversation, read as an Item (read once per run)."""
    return [
        item
        for path in sorted(corpus_dir.glob("*.jsonl"))
        for conversation in read_corpus(path)
        for item in read_items(conversation["messages"])
    ]
