"""The scripted model behind the strict Responses fake for the Codex runs: it steers one Codex
conversation through the proxy's compaction, Codex's own compaction and a recall round, reading
only what each request shows (and what it said itself).

1. Small steps (each prints about `small` lines) until a request arrives folded by the proxy.
2. Then one big step, so Codex compacts for itself: Codex compares the usage the upstream
   reported for the last request (the size the proxy forwarded) plus what was added since with
   its `model_auto_compact_token_limit` (`limit`), so a step of more than the gap gets it there,
   while the history Codex holds is past the proxy's trigger.
   A `compaction_trigger` request is answered by the fake itself; the handoff prompt of Codex's
   local compaction is answered with a summary that says `HANDOFF`.
3. After Codex's compaction (its `compaction` item, or the handoff summary, in the request): small
   steps again until the proxy folds the conversation that holds it; the first request offering
   `recall` then gets a recall call (a round the proxy answers and Codex never sees), after which
   one more step, so Codex sends back what the round left it.
4. Then `done`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from compaction import PREVIEW_MARK, SUMMARY_MARKER
from tests.e2e.apis import DONE, shell_command
from tests.fakes.responses_strict import REASONING, call, say
from tests.fakes.script import body_tokens

HANDOFF = "HANDOFF: the steps so far printed words; keep running the steps the model asks for."
_HANDOFF_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION"
RECALL_QUERY = "turn 0 alpha"
_TOKENS_PER_LINE = 7.5  # what the proxy's estimator counts for a line `shell_command` prints
_MOST_STEPS = 40  # a run that never gets there ends, and its test says what is missing


@dataclass
class CodexScript:
    limit: int
    """Codex's `model_auto_compact_token_limit`."""
    small: int = 300
    steps: int = 0
    recalled: bool = False
    steps_after_recall: int = 0

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        text = orjson.dumps(payload.get("input")).decode()
        if _asks_handoff(payload):
            return [REASONING, say(HANDOFF)]
        folded = SUMMARY_MARKER in text or PREVIEW_MARK in text
        compacted = '"type":"compaction"' in text or HANDOFF in text
        tools = {t.get("name") for t in payload.get("tools") or [] if isinstance(t, dict)}
        if compacted and folded and not self.recalled and "recall" in tools:
            self.recalled = True
            return [REASONING, call("recall", {"query": RECALL_QUERY})]
        if (self.recalled and self.steps_after_recall >= 1) or self.steps >= _MOST_STEPS:
            return [REASONING, say(DONE)]
        lines = self.small
        if folded and not compacted:  # past the gap, with room for Codex's own estimate
            gap = self.limit - body_tokens("/responses", payload) + 2000
            lines = max(self.small, int(gap / _TOKENS_PER_LINE))
        step = self._step(tools, lines)
        if step is None:
            return [REASONING, say(DONE)]
        self.steps_after_recall += self.recalled
        return [REASONING, step]

    def _step(self, tools: set[Any], lines: int) -> dict[str, Any] | None:
        command = shell_command(self.steps, lines)
        self.steps += 1
        if "exec_command" in tools:  # printed whole (Codex clips at 10k tokens unless asked)
            return call("exec_command", {"cmd": command, "max_output_tokens": 100_000})
        if "shell_command" in tools:
            return call("shell_command", {"command": command})
        if "shell" in tools:
            return call("shell", {"command": ["bash", "-lc", command]})
        return None


def _asks_handoff(payload: dict[str, Any]) -> bool:
    items = payload.get("input") or []
    last = items[-1] if items else None
    if not isinstance(last, dict) or last.get("role") != "user":
        return False
    content = last.get("content")
    parts = content if isinstance(content, list) else [{"text": content}]
    return any(str(p.get("text", "")).lstrip().startswith(_HANDOFF_PROMPT) for p in parts)
