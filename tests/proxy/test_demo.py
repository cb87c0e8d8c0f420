"""`compaction-proxy demo` runs offline and shows compactions, reuse and the memory file."""

from __future__ import annotations

import io
import json
from pathlib import Path

from proxy.demo import run_demo


async def test_the_demo_compacts_reuses_explains_and_keeps_its_memory_offline(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    assert await run_demo(out, workdir=tmp_path / "demo") == 0
    text = out.getvalue()
    assert "small body, not parsed" in text  # the first turns are never parsed
    assert "↳ compaction" in text and ", extends " in text  # a checkpoint was extended
    assert "reused" in text and "applied" in text
    assert text.count("two requests per turn") == 1  # the columns are explained once
    assert "summary adds:" in text  # what an extension added to the summary
    memory = tmp_path / "demo" / "memory" / "demo-agent" / "compaction_flush.jsonl"
    assert "memory file demo-agent/compaction_flush.jsonl" in text
    items = [json.loads(line) for line in memory.read_text().splitlines()]
    assert f"{len(items)} items" in text
    assert f"memory files kept in {memory.parent.parent}" in text
    # A turn that mentions a preference is not a preference: only the sentence that states it.
    preferences = [i["content"] for i in items if i["type"] == "preference"]
    assert "I prefer pytest over unittest." in preferences
    assert not any(p.startswith("Now make parse_iso") for p in preferences)
