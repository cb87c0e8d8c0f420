"""The seed CompactionEngine API for in-process agents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compaction import SUMMARY_MARKER, CompactionEngine, is_summary_message
from compaction.types import Message
from tests.compaction.conftest import ScriptedLLM, memory_reply
from tests.factories import simple_conversation, tool_call


def _seed_history(rounds: int) -> list[Message]:
    """The task card's history: Chinese rounds, no system message, a timestamp field."""
    history: list[Message] = []
    for i in range(rounds):
        history.append(
            {
                "role": "user",
                "content": f"第{i + 1}轮用户消息：请帮我分析问题{i + 1}",
                "timestamp": f"2026-02-25T10:{i:02d}:00",
            }
        )
        history.append(
            {
                "role": "assistant",
                "content": f"第{i + 1}轮助手回复：关于问题{i + 1}的分析结果是..." + "详细内容" * 20,
                "timestamp": f"2026-02-25T10:{i:02d}:30",
            }
        )
    return history


# ---------------------------------------------------------------- the seed API


async def test_should_compact_at_85_percent(tmp_path: Path) -> None:
    engine = CompactionEngine(None, tmp_path)
    assert await engine.should_compact(17000, 20000) is True
    assert await engine.should_compact(16000, 20000) is False
    assert await engine.should_compact(20000, 20000) is True


@pytest.mark.parametrize("with_llm", [True, False])
async def test_twenty_rounds_keep_five(tmp_path: Path, with_llm: bool) -> None:
    engine = CompactionEngine(
        ScriptedLLM(summary="这是压缩后的摘要。用户在讨论项目架构。") if with_llm else None,
        tmp_path,
    )
    history = _seed_history(20)
    result = await engine.compact(history, keep_recent=5)
    # the seed contract: the summary (the task quoted inside it) and the last five rounds
    assert len(result["compacted_history"]) == 11
    assert is_summary_message(result["compacted_history"][0])
    assert history[0]["content"] in result["summary"]
    assert result["compacted_history"][1:] == history[-10:]
    assert all(a is b for a, b in zip(result["compacted_history"][1:], history[-10:], strict=False))
    assert result["summary"] and result["compression_ratio"] < 1.0
    assert result["path"] == ("llm" if with_llm else "extractive")
    assert result["compacted_tokens"] < result["original_tokens"]
    assert 0 <= result["key_decisions_preserved"] <= result["key_decisions_total"]


async def test_twenty_rounds_with_a_system_prompt_keep_it_and_five_rounds(tmp_path: Path) -> None:
    result = await CompactionEngine(None, tmp_path).compact(simple_conversation(20), keep_recent=5)
    assert len(result["compacted_history"]) == 12  # system + summary + 5 rounds


async def test_three_rounds_come_back_unchanged(tmp_path: Path) -> None:
    llm = ScriptedLLM()
    history = _seed_history(3)
    result = await CompactionEngine(llm, tmp_path).compact(history, keep_recent=5)
    assert result["compacted_history"] == history
    assert result["compression_ratio"] == 1.0 and result["flushed_to_memory"] == []
    assert llm.calls == []


async def test_flush_writes_the_memory_file(tmp_path: Path) -> None:
    memory_dir = tmp_path / "memory"
    reply = memory_reply(("decision", "使用 React"), ("preference", "简短回答"))
    engine = CompactionEngine(
        ScriptedLLM(summary="项目讨论摘要", memory=reply), memory_dir, session_id="user"
    )
    result = await engine.compact(_seed_history(20), keep_recent=5)
    assert len(result["flushed_to_memory"]) >= 1
    flush_file = memory_dir / "user" / "compaction_flush.jsonl"
    assert flush_file.exists()
    written = [json.loads(line) for line in flush_file.read_text().splitlines()]
    assert written == result["flushed_to_memory"]
    assert {"type": "decision", "content": "使用 React"}.items() <= written[0].items()


async def test_verify_compaction_reports_quality(tmp_path: Path) -> None:
    engine = CompactionEngine(None, tmp_path)
    history = simple_conversation(12)
    call = tool_call(arguments={"command": "pytest tests/test_api.py"})
    history[3:3] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "ValueError: boom"},
    ]
    result = await engine.compact(history, keep_recent=5)
    report = await engine.verify_compaction(history, result)
    assert set(report) == {
        "quality",
        "missing_key_info",
        "key_decisions_preserved",
        "key_decisions_total",
    }
    assert report["quality"] == "good" and report["key_decisions_total"] >= 3
    stripped = [m for m in result["compacted_history"] if not is_summary_message(m)]
    bare = await engine.verify_compaction(
        history, [{"role": "user", "content": SUMMARY_MARKER + " nothing"}, *stripped]
    )
    assert bare["quality"] == "poor"
    assert "$ pytest tests/test_api.py → ValueError: boom" in bare["missing_key_info"]


def test_invalid_session_id_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        CompactionEngine(None, tmp_path, session_id="../../etc")
