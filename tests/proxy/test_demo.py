"""`compaction-proxy demo` runs offline and shows compactions, reuse and the memory file."""

from __future__ import annotations

import io

from proxy.demo import run_demo


async def test_the_demo_compacts_reuses_and_writes_memory_offline() -> None:
    out = io.StringIO()
    assert await run_demo(out) == 0
    text = out.getvalue()
    assert "small body, not parsed" in text  # the first turns are never parsed
    assert "↳ compaction" in text and ", extends " in text  # a checkpoint was extended
    assert "reused" in text
    assert "memory file demo-agent/compaction_flush.jsonl" in text
    assert "We decided to keep the stdlib only" in text  # the task itself is pinned, not mined
