"""The app's recall: which compacted requests carry the `recall` tool, and the rounds that
answer its calls (one RecallRounds per request)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.metrics import RecallMetrics
from proxy.recall.answers import Answers
from proxy.recall.rounds import Budget, RecallRounds
from proxy.recall.tools import added_text, equip, has_own_recall
from proxy.state.archive import Archive

if TYPE_CHECKING:  # the request module builds summarizers, whose cached request equips too
    from proxy.compacting.decision.request import ParsedRequest

# What the upstream may still write when the request names no output bound: this much, and at
# most this share of the window.
_DEFAULT_OUTPUT_TOKENS = 4096
_DEFAULT_OUTPUT_SHARE = 8
# Recall results fill the window up to this share of it, never to the brim.
_FILL_RATIO = 0.95
# A request goes out with no new compaction up to the trigger (0.85 of the window), where the
# rule above leaves no room: a result then had none, and the model got back an empty recall. Results
# always get this share of the window (when the window holds it): from the fill margin, and from
# half of the output reserve when that reserve is our guess (a bound the client set is kept).
_FLOOR_SHARE = 16


@dataclass(frozen=True)
class Equipped:
    body: bytes
    rounds: RecallRounds
    added_tokens: int
    """What the tool and the summary's recall line add to the request's estimate."""


@dataclass(frozen=True)
class Recall:
    archive: Archive
    memory_dir: Path
    max_rounds: int
    metrics: RecallMetrics
    native: bool = False
    """Compactions are the provider's own where the dialect has one (`compaction.summarizer:
    native`): those requests keep `tools` as sent, so the tool is not offered there."""

    def offered(self, request: ParsedRequest) -> bool:
        """True when a compacted `request` goes out with the recall tool (when its body lets
        the tool be placed): not when the client has its own `recall`; never when it sent no
        tools (no `tools`, or `tools: []`): such a request asks for text (Codex's handoff sends
        `tools: []`), and a model given a tool there calls it instead of answering; nor for a
        chat request asking for several choices (`n`): the rounds answer one choice, the
        others' calls would reach the client unanswered."""
        payload = request.payload
        tools = payload.get("tools")
        choices = payload.get("n")
        several = isinstance(choices, int) and choices > 1
        if self.native and request.dialect.native is not None:
            return False
        return (
            isinstance(tools, list) and bool(tools) and not several and not has_own_recall(payload)
        )

    def added_tokens(self, request: ParsedRequest) -> int:
        """What the tool and the summary's recall line add to a compacted `request`: counted
        where the view is chosen too, or a view just under the window's end goes out over it
        once equipped."""
        if not self.offered(request):
            return 0
        return request.estimator.count_text(added_text(request.dialect))

    def equip(self, request: ParsedRequest, body: bytes, tokens: int) -> Equipped | None:
        """The compacted `body` of `request` (estimated at `tokens`) with the recall tool, and
        the rounds that answer it; None: it goes out as it is (the client has its own `recall`
        or sent no tools, a body the tool cannot be placed in)."""
        if not self.offered(request):
            return None
        payload = request.payload
        equipped = equip(body, payload, request.dialect)
        if equipped is None:
            return None
        added = self.added_tokens(request)
        tokens += added
        answers = Answers(self.archive, self.memory_dir, request.session_id, request.conversation)
        room = recall_room(request.window, tokens, request.max_output_tokens)
        budget = Budget(room_tokens=room, max_rounds=self.max_rounds)
        rounds = RecallRounds(request.dialect, equipped, answers, budget, self.metrics)
        return Equipped(equipped, rounds, added)


def recall_room(window: int, tokens: int, max_output_tokens: int | None) -> int:
    """The tokens recall results may fill in a request of `tokens` in `window`: up to the fill
    ratio less the output's reserve, and never less than the floor share of the window that
    the window holds past the client's own output bound, or past half of our guess of it."""
    if max_output_tokens:
        reserve, kept = max_output_tokens, max_output_tokens
    else:
        reserve = min(_DEFAULT_OUTPUT_TOKENS, window // _DEFAULT_OUTPUT_SHARE)
        kept = reserve // 2
    room = int(window * _FILL_RATIO) - tokens - reserve
    floor = min(window // _FLOOR_SHARE, window - tokens - kept)
    return max(0, room, floor)
