"""What the user said still reaches the model: typed canaries, measured with a kit we did not write.

    .venv/bin/python -m bench.canaries [--seeds 12] [--window 8000] [--growth 1 2 4]
        [--models none generic extractive] [--sessions random generated]

The canaries, their sessions and their probe are compaction-conformance-kit's (0.8.0, the
`bench` extra): sessions of typed canaries planted in user turns (safety rules, hard
constraints, facts, goal state, user preferences), built at random per seed
(`build_random_session`: 20 canaries, two of them updated later; `build_generated_session`: 10
canaries from a rotating pool of subjects and phrasings, three updated, with distractors).

Each session becomes a chat conversation, then grows by neutral work rounds (a user request, a
tool call reading a file, its output, a short answer) until it has grown by 1, 2 and 4 windows.
It is replayed as an agent sends it, through the library as the proxy drives it: every request
takes its longest remembered checkpoint, and when the view reaches the trigger it is compacted
once more (an update of the summary when a checkpoint was applied). At each growth mark, the
kit's own `BehaviorProbe` reads everything the model receives (the forwarded messages' text);
a canary survives when every probe that applies to it passes.

Summarizers: none (the library's code-built summary), generic (answers one generic sentence and
an empty memory list), extractive (copies the start of what it was shown, up to its answer
budget). Printed: survival per canary type and summarizer at each growth mark, and all types;
compactions, and the requests they sent the summarizer (`--strategy`: compaction.strategy).

`--http`: the same replay through the proxy over HTTP, in front of a fake upstream on loopback,
in each of `--dialects` (chat, responses, anthropic): see bench/canaries_http.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from compaction_kit.canaries import Canary
from compaction_kit.corpus import build_random_session
from compaction_kit.generated import build_generated_session
from compaction_kit.probes import BehaviorProbe
from compaction_kit.session import SeededSession

from bench.facts import visible_text
from bench.forwarding import Forwarder
from compaction import ChatLLM, Compactor, Strategy
from compaction.settings import TARGET_RATIO
from compaction.types import Message, Purpose

GENERIC_SUMMARY = "The user and the assistant worked through several items of the project."
SESSIONS: dict[str, Callable[[int], tuple[SeededSession, list[Canary]]]] = {
    "random": build_random_session,
    "generated": build_generated_session,
}
TYPES = ("safety_rule", "hard_constraint", "fact", "goal_state", "user_preference")


class GenericLLM:
    """Answers every summary with one generic sentence, and no memory items."""

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        return GENERIC_SUMMARY if purpose == "summary" else "[]"


class ExtractiveLLM:
    """Copies the start of what it was shown, about `max_tokens` of it (no JSON for memory)."""

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        shown = str(messages[-1].get("content", ""))
        return shown[: max_tokens * 3]


SUMMARIZERS: dict[str, Callable[[], ChatLLM | None]] = {
    "none": lambda: None,
    "generic": GenericLLM,
    "extractive": ExtractiveLLM,
}


def conversation(session: SeededSession) -> list[Message]:
    """The kit's session as chat messages (its system turn first)."""
    return [{"role": turn.role, "content": turn.text} for turn in session.turns]


_SOURCE = "\n".join(
    f"def step_{i}(records):\n    # normalise and forward one batch\n"
    f"    return [r for r in records if r.get('kind') == 'batch-{i}']\n"
    for i in range(6)
)


def work_round(number: int) -> list[Message]:
    """One neutral round of agent work: nothing in it is about any canary."""
    call_id = f"call_{number}"
    path = f"src/pipeline/stage_{number}.py"
    return [
        {"role": "user", "content": f"Continue with work item {number}."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": json.dumps({"command": f"cat {path}"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": _SOURCE},
        {"role": "assistant", "content": f"Read {path}; the stage filters its batch as expected."},
    ]


def grown(
    messages: list[Message], compactor: Compactor, window: int, marks: list[int]
) -> tuple[list[Message], dict[int, int]]:
    """`messages` followed by work rounds until they grew by max(marks) windows; for each mark,
    the request that reached it (the length of the history up to its tool result)."""
    history = list(messages)
    base = compactor.estimate(history)
    reached: dict[int, int] = {}
    number = 1
    while len(reached) < len(marks):
        history += work_round(number)
        number += 1
        growth = compactor.estimate(history) - base
        for mark in marks:
            if mark not in reached and growth >= mark * window:
                reached[mark] = len(history) - 1
    return history, reached


@dataclass
class Tally:
    held: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    total: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    compactions: int = 0
    model_calls: int = 0

    def count(self, canary: Canary, mark: int, survived: bool) -> None:
        for kind in (canary.type.value, "all"):
            self.total[kind, mark] += 1
            self.held[kind, mark] += survived

    def share(self, kind: str, mark: int) -> float:
        total = self.total[kind, mark]
        return self.held[kind, mark] / total if total else 0.0


async def replay(
    messages: list[Message],
    canaries: list[Canary],
    reached: dict[int, int],
    llm: ChatLLM | None,
    window: int,
    tally: Tally,
    strategy: Strategy = "hybrid",
    target_ratio: float = TARGET_RATIO,
) -> None:
    """The agent's requests, each the history up to a user or tool message, forwarded as the
    proxy would; the canaries probed in what the model receives at each growth mark."""
    forwarder = Forwarder(
        messages,
        seed=b"canaries",
        window=window,
        llm=llm,
        strategy=strategy,
        target_ratio=target_ratio,
    )
    probe = BehaviorProbe()
    ends = [i + 1 for i, m in enumerate(messages) if m["role"] in ("user", "tool")]
    marks = {end: mark for mark, end in reached.items()}
    for end in ends:
        forwarded = await forwarder.forward(end)
        tally.compactions += forwarded.result is not None
        tally.model_calls += forwarded.result.model_calls if forwarded.result else 0
        if end in marks:
            text = visible_text(forwarded.messages)
            for canary in canaries:
                tally.count(canary, marks[end], probe.probe(canary, text).survived)


async def measure(args: argparse.Namespace) -> dict[str, Tally]:
    tallies: dict[str, Tally] = {name: Tally() for name in args.models}
    sizer = Compactor()
    for kind in args.sessions:
        for seed in range(1, args.seeds + 1):
            session, canaries = SESSIONS[kind](seed)
            messages, reached = grown(conversation(session), sizer, args.window, args.growth)
            for name in args.models:
                llm = SUMMARIZERS[name]()
                await replay(
                    messages,
                    canaries,
                    reached,
                    llm,
                    args.window,
                    tallies[name],
                    args.strategy,
                    args.target_ratio,
                )
    return tallies


async def measure_http(args: argparse.Namespace, dialect: str) -> dict[str, Tally]:
    """As `measure`, each request sent through the proxy over HTTP in `dialect`."""
    from bench.canaries_http import Conversation, replay_over_http
    from bench.dialects import WIRES

    tallies: dict[str, Tally] = {name: Tally() for name in args.models}
    sizer = Compactor()
    for name in args.models:
        conversations: list[Conversation] = []
        for kind in args.sessions:
            for seed in range(1, args.seeds + 1):
                session, canaries = SESSIONS[kind](seed)
                messages, reached = grown(conversation(session), sizer, args.window, args.growth)
                label = f"{dialect}-{name}-{kind}-{seed}"
                conversations.append((label, messages, canaries, reached))
        tallies[name].compactions = await replay_over_http(
            conversations,
            WIRES[dialect],
            SUMMARIZERS[name](),
            args.window,
            tallies[name].count,
            args.target_ratio,
        )
    return tallies


def report(tallies: dict[str, Tally], marks: list[int], window: int) -> str:
    header = f"{'summarizer':<11} {'canary type':<16}" + "".join(
        f" {f'{mark} window' + ('s' if mark > 1 else ''):>10}" for mark in marks
    )
    lines = [f"window {window} tokens; survival (kit's BehaviorProbe) after growth of", header]
    for name, tally in tallies.items():
        for kind in (*TYPES, "all"):
            cells = "".join(f" {100 * tally.share(kind, mark):9.1f}%" for mark in marks)
            lines.append(f"{name:<11} {kind:<16}{cells}")
        lines.append(f"{name:<11} {'compactions':<16} {tally.compactions:>10}")
        lines.append(f"{name:<11} {'model calls':<16} {tally.model_calls:>10}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=12, help="sessions per kind, seeds 1..N")
    parser.add_argument("--window", type=int, default=8000)
    parser.add_argument("--growth", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--models", nargs="*", default=list(SUMMARIZERS), choices=SUMMARIZERS)
    parser.add_argument("--sessions", nargs="*", default=list(SESSIONS), choices=SESSIONS)
    parser.add_argument("--http", action="store_true", help="through the proxy over HTTP")
    parser.add_argument(
        "--dialects", nargs="*", default=["chat", "responses", "anthropic"], help="with --http"
    )
    parser.add_argument("--strategy", choices=["summary", "selective", "hybrid"], default="hybrid")
    parser.add_argument(
        "--target-ratio", type=float, default=TARGET_RATIO, help="compaction.target_ratio"
    )
    args = parser.parse_args()
    args.growth = sorted(args.growth)
    if not args.http:
        tallies = asyncio.run(measure(args))
        print(f"strategy {args.strategy}, target_ratio {args.target_ratio}")
        print(report(tallies, args.growth, args.window))
        return
    for dialect in args.dialects:
        print(f"through the proxy over HTTP, {dialect}, target_ratio {args.target_ratio}")
        tallies = asyncio.run(measure_http(args, dialect))
        print(report(tallies, args.growth, args.window).replace("compactions", "summary calls"))


if __name__ == "__main__":
    main()
