"""Time the compaction decision path (no LLM): estimate, split, plan, beside orjson parse+dump.

Run: .venv/bin/python -m bench.decision [--repeats N]. Uses the largest corpus conversations
($COMPACTION_PROXY_CORPUS or ../shared/corpus) and a synthetic 128k-token agent conversation.
Prints median and p90 in milliseconds; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from bench.corpus import CORPUS_ENV, corpus_dir, read_corpus
from compaction.plan import plan_compaction
from compaction.segment import split
from compaction.tokens import HeuristicEstimator, estimate_request

WINDOW = 128_000
ESTIMATOR = HeuristicEstimator()


def largest_corpus_bodies(count: int) -> list[tuple[str, dict[str, Any]]]:
    """The `count` largest corpus conversations as request bodies, by serialized size."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    for path in sorted(corpus_dir().glob("*.jsonl")):
        for conv in read_corpus(path):
            body = {
                "model": "gpt-4o",
                "messages": conv["messages"],
                "tools": conv.get("tools") or None,
            }
            found.append((len(orjson.dumps(conv["messages"])), conv["id"], body))
    found.sort(key=lambda item: item[0], reverse=True)
    return [(conv_id, body) for _, conv_id, body in found[:count]]


def synthetic_body(target_tokens: int = WINDOW) -> dict[str, Any]:
    """A coding-agent conversation of about `target_tokens`: rounds of parallel tool calls."""
    output = "src/module.py:12: AssertionError: expected 3, got 4\n" * 12
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 40}
    ]
    i = 0
    while estimate_request(messages, None, ESTIMATOR) < target_tokens:
        messages.append(
            {"role": "user", "content": f"Task {i}: fix the failing test in src/module_{i}.py"}
        )
        for j in range(8):
            calls = [
                {
                    "id": f"call_{i}_{j}_{k}",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": orjson.dumps({"command": f"pytest -k t{k}"}).decode(),
                    },
                }
                for k in range(2)
            ]
            messages.append(
                {"role": "assistant", "content": "Running the tests.", "tool_calls": calls}
            )
            messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": output} for c in calls
            ]
        messages.append({"role": "assistant", "content": f"Fixed task {i}."})
        i += 1
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a shell command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    return {"model": "gpt-4o", "messages": messages, "tools": tools}


def time_ms(action: Callable[[], object], repeats: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.9 * len(samples)))]


def measure(name: str, body: dict[str, Any], repeats: int) -> None:
    raw = orjson.dumps(body)
    messages, tools = body["messages"], body.get("tools")
    tokens = estimate_request(messages, tools, ESTIMATOR)
    segments = split(messages, ESTIMATOR, tools)
    plan = plan_compaction(segments, window=WINDOW)
    timings = {
        "orjson loads+dumps": time_ms(lambda: orjson.dumps(orjson.loads(raw)), repeats),
        "estimate": time_ms(lambda: estimate_request(messages, tools, ESTIMATOR), repeats),
        "split": time_ms(lambda: split(messages, ESTIMATOR, tools), repeats),
        "split+plan": time_ms(
            lambda: plan_compaction(split(messages, ESTIMATOR, tools), window=WINDOW), repeats
        ),
    }
    print(
        f"\n{name}: {len(messages)} messages, {len(raw) / 1e6:.2f} MB, ~{tokens} tokens, "
        f"plan folds {len(plan.folded)} and keeps from {plan.keep_from} (fits={plan.fits})"
    )
    for label, (median, p90) in timings.items():
        print(f"  {label:<20} median {median:7.2f} ms   p90 {p90:7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--largest", type=int, default=3)
    args = parser.parse_args()
    print(f"decision path, window {WINDOW} tokens, {args.repeats} runs each")
    measure("synthetic 128k-token agent conversation", synthetic_body(), args.repeats)
    if not corpus_dir().is_dir():
        print(f"\ncorpus not found at {corpus_dir()} (set {CORPUS_ENV}); skipped")
        return
    for conv_id, body in largest_corpus_bodies(args.largest):
        measure(f"corpus {conv_id}", body, args.repeats)


if __name__ == "__main__":
    main()
