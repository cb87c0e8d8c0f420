"""What the agent still has after compactions: corpus replayed through the library as the proxy does.

Every corpus conversation is sent as its growing requests (each prefix that ends in a user or
tool message). Like the proxy, each request takes its longest remembered checkpoint, and when the
view reaches the trigger it is compacted once more (an extension when a checkpoint was applied)
and the new checkpoint is stored. Two summarizers: none (the code-built fallback) and a lossy
scripted model that answers generic prose and an empty memory list.

Printed per source, window and summarizer (facts as bench/facts.py defines them):
- retention of paths, commands, errors, ids and user requests: of the facts the conversation has
  shown so far, the share still in the forwarded request ∪ memory, at every request from the
  conversation's first compaction on. Per request, so that a fact is weighed by how long the
  agent lacks it, not by how many compactions happened meanwhile; over every fact shown, not
  only those folded, so that a strategy folding less never reads as keeping less (a share of the
  folded facts falls when fewer are folded and the same few are lost);
- task: share of compacted requests whose forwarded list still holds the first user request;
- post: median size of the request just after a compaction, as a share of the window;
- comp/conv, and conversations that compacted on most (over half) of their requests;
- invalid: forwarded lists with a tool result without its call or a call without its result.

    .venv/bin/python -m bench.retention [--per-source 40] [--windows 8000 32000]
        [--models none lossy] [--sources swe_mini tau] [--jobs 2] [--examples]
        [--strategy summary|selective|hybrid]

Also printed: calls, the requests sent to the summarizing model (summary and memory), and prev,
the compactions that only cut old tool outputs to previews (`--strategy`: compaction.strategy).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.corpus import CORPUS_ENV, corpus_dir, has_corpus, read_corpus
from bench.facts import (
    KINDS,
    Facts,
    facts_of,
    is_request,
    pairing_is_valid,
    task_words,
    visible_text,
)
from bench.facts import flat as flatten
from bench.forwarding import Forwarder
from compaction import Strategy
from compaction.settings import TARGET_RATIO
from compaction.types import Message, Purpose

FILES = {
    "swe_mini": "swe_mini_gemini3pro.jsonl",
    "swe_mini_tc": "swe_mini_gemini3pro_toolcalls.jsonl",
    "swe_gym": "swe_gym_openhands.jsonl",
    "tau": "tau_bench_airline_gpt4o.jsonl",
    "locomo": "locomo10.jsonl",
}
LOSSY_SUMMARY = "The agent worked on the task and made progress. Several steps were taken."


class LossyLLM:
    """A summarizer that keeps nothing specific: generic prose, and no memory items."""

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        return LOSSY_SUMMARY if purpose == "summary" else "[]"


@dataclass
class Tally:
    conversations: int = 0
    requests: int = 0
    compactions: int = 0
    compacted_requests: int = 0
    model_calls: int = 0
    previewed: int = 0
    task_present: int = 0
    invalid: int = 0
    mostly_compacting: int = 0
    post_ratios: list[float] = field(default_factory=list)
    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    kept: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in (
            "conversations",
            "requests",
            "compactions",
            "compacted_requests",
            "model_calls",
            "previewed",
            "task_present",
            "invalid",
            "mostly_compacting",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.post_ratios += other.post_ratios
        self.examples += other.examples
        for kind in KINDS:
            self.total[kind] += other.total[kind]
            self.kept[kind] += other.kept[kind]


def request_ends(messages: list[Any]) -> list[int]:
    """Lengths of the prefixes the agent sent: each ends in a user or tool message."""
    return [
        i + 1
        for i, m in enumerate(messages)
        if m.get("role") in ("user", "tool")
        and (i + 1 == len(messages) or messages[i + 1].get("role") != "tool")
    ]


def _measure(
    facts: list[Facts], shown: dict[str, set[str]], folded: list[int], haystack: str, tally: Tally
) -> None:
    """Count the facts `shown` so far, and those of them the agent still has: all but the
    folded ones missing from `haystack` (a kept message is in it whole)."""
    for kind in KINDS:
        wanted: set[str] = set()
        for i in folded:
            wanted |= facts[i].by_kind[kind]
        lost = sum(1 for fact in wanted if flatten(fact) not in haystack)
        tally.total[kind] += len(shown[kind])
        tally.kept[kind] += len(shown[kind]) - lost


async def replay(
    conversation: dict[str, Any],
    window: int,
    lossy: bool,
    strategy: Strategy = "hybrid",
    target_ratio: float = TARGET_RATIO,
) -> Tally:
    messages: list[Any] = conversation["messages"]
    tools = conversation.get("tools") or None
    tally = Tally(conversations=1)
    llm = LossyLLM() if lossy else None
    forwarder = Forwarder(
        messages,
        seed=b"retention",
        window=window,
        llm=llm,
        tools=tools,
        strategy=strategy,
        target_ratio=target_ratio,
    )
    facts = [facts_of(m) for m in messages]
    task_index = next((i for i, m in enumerate(messages) if is_request(m)), None)
    words = task_words(messages[task_index]) if task_index is not None else set()
    memory: list[str] = []
    shown: dict[str, set[str]] = {kind: set() for kind in KINDS}
    ends = request_ends(messages)
    applied = 0
    last_summary = ""
    start = 0
    for end in ends:
        for message_facts in facts[start:end]:
            for kind in KINDS:
                shown[kind] |= message_facts.by_kind[kind]
        start = end
        sent = await forwarder.forward(end)
        forwarded, result = sent.messages, sent.result
        if result is not None:
            memory += [item.content for item in result.memory_items]
            applied += 1
            tally.compactions += 1
            tally.model_calls += result.model_calls
            tally.previewed += result.path == "selective"
            tally.post_ratios.append(result.tokens_after / window)
            last_summary = result.summary_text
        if applied:
            kept_ids = {id(m) for m in forwarded}
            folded = [i for i in range(end) if id(messages[i]) not in kept_ids]
            haystack = visible_text(forwarded) + "\n" + flatten("\n".join(memory))
            _measure(facts, shown, folded, haystack, tally)
        tally.requests += 1
        tally.invalid += not pairing_is_valid(forwarded)
        if sent.changed:
            tally.compacted_requests += 1
            if task_index is not None and task_index < end:
                present = any(m is messages[task_index] for m in forwarded)
                if not present and words:
                    text = visible_text(forwarded)
                    present = sum(1 for w in words if w in text) >= 0.8 * len(words)
                tally.task_present += present
    tally.mostly_compacting = int(len(ends) >= 4 and applied > len(ends) / 2)
    if last_summary:
        tally.examples.append(f"{conversation['id']}\n{last_summary}")
    return tally


def _job(args: tuple[dict[str, Any], int, bool, Strategy, float]) -> Tally:
    return asyncio.run(replay(*args))


def sample(path: Path, per_source: int) -> list[dict[str, Any]]:
    rows = list(read_corpus(path))
    if per_source <= 0 or len(rows) <= per_source:
        return rows
    step = (len(rows) - 1) / (per_source - 1) if per_source > 1 else 0
    return [rows[round(k * step)] for k in range(per_source)]


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "     -"


def row(name: str, t: Tally) -> str:
    post = statistics.median(t.post_ratios) if t.post_ratios else 0.0
    retention = " ".join(_pct(t.kept[k], t.total[k]) for k in KINDS)
    return (
        f"{name:<22} {t.conversations:4} {t.requests:6} {t.compactions / max(t.conversations, 1):6.1f}"
        f" {t.mostly_compacting:5} {_pct(t.task_present, t.compacted_requests)} {t.invalid:4}"
        f" {post:5.2f}  {retention} {t.model_calls:6} {t.previewed:5}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-source", type=int, default=40, help="0: every conversation")
    parser.add_argument("--windows", type=int, nargs="*", default=[8000, 32000])
    parser.add_argument("--models", nargs="*", default=["none", "lossy"])
    parser.add_argument("--sources", nargs="*", default=list(FILES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--examples", action="store_true", help="print one final summary each")
    parser.add_argument("--strategy", choices=["summary", "selective", "hybrid"], default="hybrid")
    parser.add_argument(
        "--target-ratio", type=float, default=TARGET_RATIO, help="compaction.target_ratio"
    )
    args = parser.parse_args()
    if not has_corpus():
        print(f"corpus not found at {corpus_dir()} (set {CORPUS_ENV})", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"strategy {args.strategy}, target_ratio {args.target_ratio}")
    print(
        f"{'source window model':<22} conv   reqs comp/c  most   task  inv  post"
        f"  {'  '.join(k[:5].rjust(5) for k in KINDS)}  calls  prev"
    )
    overall = Tally()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for source in args.sources:
            conversations = sample(corpus_dir() / FILES[source], args.per_source)
            for window in args.windows:
                for model in args.models:
                    jobs = [
                        (c, window, model == "lossy", args.strategy, args.target_ratio)
                        for c in conversations
                    ]
                    tally = Tally()
                    for part in pool.map(_job, jobs, chunksize=4):
                        tally.add(part)
                    print(row(f"{source} {window // 1000}k {model}", tally), flush=True)
                    if args.examples and tally.examples:
                        print("    example:", tally.examples[len(tally.examples) // 2][:3000])
                    overall.add(tally)
    print(row("overall", overall))
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
