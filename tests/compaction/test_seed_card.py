"""The original task card's own tests, as written, against the library.

Only the card's fakes are ours: its `MockLLMClient(responses={"gemini-flash": text})` answers every
call with `text`, which is what `ScriptedLLM(summary=text, memory=text)` does here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compaction import CompactionEngine
from tests.compaction.conftest import ScriptedLLM


def MockLLMClient(responses: dict[str, str] | None = None) -> ScriptedLLM:
    text = (responses or {}).get("gemini-flash", "")
    return ScriptedLLM(summary=text, memory=text)


async def test_should_compact_threshold() -> None:
    engine = CompactionEngine(None, "/tmp")

    assert await engine.should_compact(17000, 20000) is True  # 85%
    assert await engine.should_compact(16000, 20000) is False  # 80%
    assert await engine.should_compact(20000, 20000) is True  # 100%


async def test_compact_preserves_recent(tmp_path: Path) -> None:
    memory_dir = _setup_memory(tmp_path)
    llm = MockLLMClient(responses={"gemini-flash": "这是压缩后的摘要。用户在讨论项目架构。"})
    engine = CompactionEngine(llm, str(memory_dir))

    history = _make_long_history(20)  # 20 rounds
    result = await engine.compact(history, keep_recent=5)

    # the last 5 rounds = 10 messages, plus the summary message: 11 in all
    assert len(result["compacted_history"]) <= 11


async def test_compact_has_summary(tmp_path: Path) -> None:
    memory_dir = _setup_memory(tmp_path)
    llm = MockLLMClient(responses={"gemini-flash": "项目讨论摘要"})
    engine = CompactionEngine(llm, str(memory_dir))

    history = _make_long_history(20)
    result = await engine.compact(history, keep_recent=5)

    assert result["summary"] != ""
    assert result["compression_ratio"] < 1.0


async def test_compact_short_history_no_op(tmp_path: Path) -> None:
    memory_dir = _setup_memory(tmp_path)
    llm = MockLLMClient()
    engine = CompactionEngine(llm, str(memory_dir))

    history = _make_long_history(3)  # only 3 rounds
    result = await engine.compact(history, keep_recent=5)

    assert result["compacted_history"] == history


async def test_flush_writes_to_memory(tmp_path: Path) -> None:
    memory_dir = _setup_memory(tmp_path)
    llm = MockLLMClient(
        responses={
            "gemini-flash": json.dumps(
                [
                    {"type": "decision", "content": "使用 React"},
                    {"type": "preference", "content": "简短回答"},
                ]
            ),
        }
    )
    engine = CompactionEngine(llm, str(memory_dir))

    history = _make_long_history(20)
    result = await engine.compact(history, keep_recent=5)

    assert len(result["flushed_to_memory"]) >= 1
    flush_file = memory_dir / "user/compaction_flush.jsonl"
    assert flush_file.exists()


def _setup_memory(tmp_path: Path) -> Path:
    memory_dir = tmp_path / "memory"
    (memory_dir / "user").mkdir(parents=True)
    return memory_dir


def _make_long_history(rounds: int) -> list[dict[str, Any]]:
    """N rounds of conversation."""
    history = []
    for i in range(rounds):
        history.append(
            {
                "role": "user",
                "content": f"第{i + 1}轮用户消息：请帮我分析问题{i + 1}",
                "timestamp": f"2026-02-25T{10 + i // 6:02d}:{(i % 6) * 10:02d}:00",
            }
        )
        history.append(
            {
                "role": "assistant",
                "content": f"第{i + 1}轮助手回复：关于问题{i + 1}的分析结果是..." + "详细内容" * 20,
                "timestamp": f"2026-02-25T{10 + i // 6:02d}:{(i % 6) * 10 + 5:02d}:00",
            }
        )
    return history
