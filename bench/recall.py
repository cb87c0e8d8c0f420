"""Anything folded can be recalled: questions about what a compaction folded, asked through the
proxy of a model that calls `recall` when the answer is not in what it is sent.

    .venv/bin/python -m bench.recall [--seeds 3] [--per-source 2] [--window 8000] [--growth 4]
        [--dialects chat responses anthropic] [--sessions random generated]

Conversations: compaction-conformance-kit's sessions of typed canaries (as bench.canaries builds
them; the question is each canary's `direct_question`, the answer must hold its
`required_tokens`), and corpus trajectories with tool calls, asked about a line of a tool's
output (by three of its words that no other message holds together; the answer must hold another
word of that line). Each grows by neutral work rounds (bench.canaries) until it has grown by
`--growth` windows, and is sent through the proxy about every half window, as the agent's
requests, in each dialect (bench.dialects converts the chat history). Then every question is
asked as the next user turn, whole and streamed, of a proxy with `compaction.recall: on` and of
one with `off` (the figure without recall). The upstream is bench.fake_model: it answers from its
context, calls `recall` with the question's key terms when the answer is not there (and the tool
is offered), and answers from what recall returns; its summaries are one generic sentence, so
what was folded survives only in the proxy's archive and the pinned instructions.

A question counts when the model answers it right from the whole conversation, uncompacted (the
others measure the model, not the proxy: said in the output). Printed: share answered right per
dialect and streaming, with recall and without; recall calls the client saw (must be none); and
the proxy's own time in a recall round (target <= 10 ms beyond the extra upstream call): the
median of x-compaction-recall-ms per round, and from outside, the client's wait less the
upstream's time, recall on less recall off, per question that took one round.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import re
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.canaries import SESSIONS, conversation, grown
from bench.corpus import corpus_dir, has_corpus, read_corpus
from bench.dialects import WIRES
from bench.fake_model import QUESTION, FakeModel, Turns, answer_text, decide, held, key_terms
from compaction import Compactor, HeuristicEstimator
from compaction.types import Message
from proxy.app import create_app
from proxy.http import keys
from proxy.http.serving import serve_on_loopback
from proxy.settings import Settings

DIALECTS = ("chat", "responses", "anthropic")
CORPUS_FILES = ("swe_mini_gemini3pro_toolcalls.jsonl", "swe_gym_openhands.jsonl")
ROUNDS = "x-compaction-recall-rounds"
PROXY_MS = "x-compaction-recall-ms"
_WORD = re.compile(r"[a-z]{4,}")
_TOKEN = re.compile(r"[A-Za-z0-9_./:-]{5,}")
_HEADERS = {"Authorization": "Bearer sk-bench-recall"}
# The agent's own tool: the proxy offers `recall` only to a request that came with tools (a
# request without any asks for text: DESIGN 6d), and an agent that recalls is one that acts.
AGENT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@dataclass(frozen=True)
class Question:
    text: str
    required: tuple[str, ...]
    kind: str
    """The canary's type, or `tool_output`."""


@dataclass
class Case:
    session: str
    messages: list[Message]
    tools: list[Any] | None
    questions: list[Question]
    sends: list[int] = field(default_factory=list)
    """The lengths of the prefixes sent while it grows."""


@dataclass
class Answered:
    right: bool
    rounds: int
    leaked: bool
    proxy_s: float
    recall_ms: float | None
    question: Question | None = None
    answer: str = ""
    results: tuple[str, ...] = ()
    """The recall results the model read for it (one per round)."""

    @property
    def header_only(self) -> int:
        """Results that carried only their header line: nothing for the model to answer from."""
        return sum(not has_content(result) for result in self.results)


def has_content(result: str) -> bool:
    """Whether a recall result gives the model something: a result under its header, or a
    sentence saying why none is shown (never a header line alone)."""
    text = result.strip()
    return "\n" in text or not text.endswith(":")


def is_right(answer: str, question: Question) -> bool:
    lowered = answer.lower()
    return all(token.lower() in lowered for token in question.required)


def answers_in_full(messages: list[Message], question: Question) -> bool:
    """Whether the model answers right from the whole conversation, uncompacted."""
    context = [line for m in messages for line in _flat(m).splitlines()]
    answer, _ = decide(Turns(question.text, context, None, offers_recall=False))
    return is_right(answer, question)


def _searched(message: Message) -> str:
    calls = message.get("tool_calls") or []
    arguments = [str(call.get("function", {}).get("arguments", "")) for call in calls]
    return "\n".join([_flat(message), *arguments])


def _flat(message: Message) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


# -- the conversations -------------------------------------------------------------------------


def kit_cases(kinds: list[str], seeds: int, window: int, growth: int) -> list[Case]:
    sizer = Compactor()
    cases = []
    for kind in kinds:
        for seed in range(1, seeds + 1):
            session, canaries = SESSIONS[kind](seed)
            messages, _ = grown(conversation(session), sizer, window, [growth])
            questions = [
                Question(c.direct_question, c.required_tokens, c.type.value) for c in canaries
            ]
            cases.append(Case(f"kit-{kind}-{seed}", messages, AGENT_TOOLS, questions))
    return cases


def corpus_cases(per_source: int, questions: int, window: int, growth: int) -> list[Case]:
    """Trajectories of at most two windows with tool outputs to ask about."""
    sizer = Compactor()
    cases = []
    for name in CORPUS_FILES:
        taken = 0
        for number, row in enumerate(read_corpus(corpus_dir() / name)):
            base: list[Message] = row["messages"]
            if not 0.5 * window < sizer.estimate(base) <= 2 * window:
                continue
            messages, _ = grown(base, sizer, window, [growth])
            asked = tool_questions(base, messages, questions, seed=number)
            if len(asked) < questions:
                continue
            tools = row.get("tools") or AGENT_TOOLS  # a trajectory that calls tools had them
            cases.append(Case(f"corpus-{name[:8]}-{number}", messages, tools, asked))
            taken += 1
            if taken == per_source:
                break
    return cases


def tool_questions(
    base: list[Message], messages: list[Message], count: int, *, seed: int
) -> list[Question]:
    """Questions about lines of the trajectory's tool outputs: three of the line's words no
    other message holds together, and another of its words as the answer."""
    # What the archive searches: the text and the calls' arguments.
    texts = [_searched(m).lower() for m in messages]
    rng = random.Random(seed)
    found: list[Question] = []
    outputs = [i for i, m in enumerate(base) if m.get("role") == "tool" and len(_flat(m)) < 3000]
    rng.shuffle(outputs)
    for index in outputs:
        lines = [line for line in _flat(base[index]).splitlines() if len(line) < 300]
        rng.shuffle(lines)
        for line in lines:
            question = _question_about(line, texts, index)
            if question is not None:
                found.append(question)
                break
        if len(found) == count:
            break
    return found


def _question_about(line: str, texts: list[str], index: int) -> Question | None:
    words = [w for w in dict.fromkeys(_WORD.findall(line.lower())) if w not in _COMMON]
    if len(words) < 4:
        return None
    terms = words[:3]
    holders = [
        i for i, text in enumerate(texts) if all(re.search(rf"\b{t}\b", text) for t in terms)
    ]
    if holders != [index]:
        return None
    text = f"What did the earlier tool output say about {' '.join(terms)}?"
    if key_terms(text) != terms:
        return None
    # Only this line of the conversation holds the terms' stems: the model can find it.
    lines = [other for t in texts for other in t.splitlines()]
    if sum(held(other, terms) == len(terms) for other in lines) != 1:
        return None
    answers = [t for t in _TOKEN.findall(line) if not any(t.lower().startswith(w) for w in terms)]
    if not answers:
        return None
    return Question(text, (answers[0],), "tool_output")


_COMMON = frozenset(
    [
        "what",
        "that",
        "this",
        "with",
        "from",
        "have",
        "were",
        "been",
        "will",
        "about",
        "tool",
        "output",
    ]
)


def plan_sends(case: Case, window: int) -> None:
    """The prefixes an agent sends, about every half window of growth (each ends on a user or
    tool message)."""
    estimator = HeuristicEstimator()
    total, mark = 0, window // 2
    for end, message in enumerate(case.messages, start=1):
        total += estimator.count_message(message)
        ends_request = message.get("role") in ("user", "tool") and (
            end == len(case.messages) or case.messages[end].get("role") != "tool"
        )
        if ends_request and total >= mark:
            case.sends.append(end)
            mark = total + window // 2


# -- through the proxy -------------------------------------------------------------------------


async def start_proxy(upstream: str, folder: Path, window: int, recall: str) -> web.AppRunner:
    settings = Settings.model_validate(
        {
            "upstream": {"base_url": f"{upstream}/v1", "anthropic_base_url": f"{upstream}/v1"},
            "models": {"default_context_window": window, "discover": False},
            "compaction": {"recall": recall},
            "memory": {"dir": str(folder / "memory")},
            "state": {"backend": "sqlite", "path": str(folder / "state.sqlite3")},
        }
    )
    runner, _ = await serve_on_loopback(create_app(settings))
    return runner


async def settle(app: web.Application, lasting: int) -> None:
    """Wait until the proxy's background work (archive writes, compactions prepared ahead) is
    done, so the archive holds what was folded: `lasting` tasks run as long as the proxy."""
    tasks = app[keys.TASKS]
    for _ in range(500):
        if len(tasks) <= lasting:
            return
        await asyncio.sleep(0.01)


async def grow(
    client: aiohttp.ClientSession, url: str, dialect: str, case: Case, session: str
) -> None:
    wire = WIRES[dialect]
    for end in case.sends:
        body = wire.body(case.messages[:end], case.tools)
        async with client.post(
            f"{url}/v1/{wire.path}", json=body, headers={**_HEADERS, "X-Session-Id": session}
        ) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"growth request: {response.status}")


async def ask(
    client: aiohttp.ClientSession,
    url: str,
    dialect: str,
    case: Case,
    session: str,
    question: Question,
    stream: bool,
    model: FakeModel,
    tag: str,
) -> Answered:
    wire = WIRES[dialect]
    body = wire.body([*case.messages, {"role": "user", "content": question.text}], case.tools)
    if stream:
        body["stream"] = True
    headers = {**_HEADERS, "X-Session-Id": session, QUESTION: tag}
    started = time.perf_counter()
    async with client.post(f"{url}/v1/{wire.path}", json=body, headers=headers) as response:
        raw = await response.read()
        status = response.status
        rounds = int(response.headers.get(ROUNDS, "0"))
        recall_ms = response.headers.get(PROXY_MS)
    waited = time.perf_counter() - started
    results = tuple(model.recalled.get(tag, ()))
    if status != 200:
        return Answered(False, rounds, False, waited, None, question, "", results)
    text, leaked = answer_text(dialect, raw, stream)
    rounds = max(rounds, model.calls.get(tag, 0))
    return Answered(
        is_right(text, question) and not leaked,
        rounds,
        leaked,
        waited - model.busy_s.get(tag, 0.0),
        float(recall_ms) if recall_ms is not None else None,
        question,
        text,
        results,
    )


Key = tuple[str, bool, str]
"""(dialect, streamed, recall on|off)"""


@dataclass
class Results:
    answered: dict[Key, list[Answered]] = field(default_factory=lambda: defaultdict(list))
    added_s: list[float] = field(default_factory=list)
    """Per question that took one recall round: proxy time with recall less without."""
    excluded: int = 0
    asked: int = 0


async def measure(cases: list[Case], dialects: list[str], window: int, results: Results) -> None:
    model = FakeModel()
    upstream_app = web.Application(client_max_size=64 << 20)
    upstream_app.add_routes(model.routes())
    upstream_runner, upstream = await serve_on_loopback(upstream_app)
    tags = itertools.count()
    try:
        with tempfile.TemporaryDirectory() as folder:
            proxies = {
                recall: await start_proxy(upstream, Path(folder) / recall, window, recall)
                for recall in ("on", "off")
            }
            lasting = {recall: len(runner.app[keys.TASKS]) for recall, runner in proxies.items()}
            urls = {
                recall: f"http://127.0.0.1:{runner.addresses[0][1]}"
                for recall, runner in proxies.items()
            }
            try:
                async with aiohttp.ClientSession() as client:
                    for dialect in dialects:
                        for case in cases:
                            session = f"{case.session}-{dialect}"
                            for recall in ("on", "off"):
                                await grow(client, urls[recall], dialect, case, session)
                                await settle(proxies[recall].app, lasting[recall])
                            for question in case.questions:
                                for stream in (False, True):
                                    by_recall = {}
                                    for recall in ("on", "off"):
                                        tag = str(next(tags))
                                        by_recall[recall] = await ask(
                                            client, urls[recall], dialect, case, session,
                                            question, stream, model, tag,
                                        )  # fmt: skip
                                        results.answered[dialect, stream, recall].append(
                                            by_recall[recall]
                                        )
                                    if by_recall["on"].rounds == 1:
                                        results.added_s.append(
                                            by_recall["on"].proxy_s - by_recall["off"].proxy_s
                                        )
            finally:
                for runner in proxies.values():
                    await runner.cleanup()
    finally:
        await upstream_runner.cleanup()


def build_cases(args: argparse.Namespace, results: Results) -> list[Case]:
    cases = kit_cases(args.sessions, args.seeds, args.window, args.growth)
    if args.per_source and has_corpus():
        cases += corpus_cases(args.per_source, args.questions, args.window, args.growth)
    for case in cases:
        kept = [q for q in case.questions if answers_in_full(case.messages, q)]
        results.asked += len(case.questions)
        results.excluded += len(case.questions) - len(kept)
        case.questions = kept
        plan_sends(case, args.window)
    return cases


def share(answered: list[Answered]) -> float:
    return 100 * sum(a.right for a in answered) / len(answered) if answered else 0.0


def report(
    results: Results, dialects: list[str], cases: list[Case], args: argparse.Namespace
) -> str:
    counted = sum(len(case.questions) for case in cases)
    kinds: dict[str, int] = defaultdict(int)
    for case in cases:
        for question in case.questions:
            kinds[question.kind] += 1
    lines = [
        f"window {args.window} tokens, grown {args.growth} windows; {counted} questions in "
        f"{len(cases)} conversations ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))});"
        f" {results.excluded} of {results.asked} left out: the model misses them in full context",
        f"{'dialect':<10} {'stream':<6} {'recall on':>10} {'recall off':>11} {'rounds':>7}"
        f" {'leaked':>7} {'answered':>9} {'header only':>12}",
    ]
    every: dict[str, list[Answered]] = defaultdict(list)
    for dialect in dialects:
        for stream in (False, True):
            on = results.answered[dialect, stream, "on"]
            off = results.answered[dialect, stream, "off"]
            every["on"] += on
            every["off"] += off
            replied = f"{sum(bool(a.answer.strip()) for a in on)}/{len(on)}"
            lines.append(
                f"{dialect:<10} {'yes' if stream else 'no':<6} {share(on):9.1f}% {share(off):10.1f}%"
                f" {sum(a.rounds for a in on):7} {sum(a.leaked for a in on):7} {replied:>9}"
                f" {sum(a.header_only for a in on):12}"
            )
    lines.append(f"{'all':<17} {share(every['on']):9.1f}% {share(every['off']):10.1f}%")
    read = [result for a in every["on"] for result in a.results]
    with_content = sum(map(has_content, read))
    lines.append(
        f"recall results with content: {with_content} of {len(read)} (header only: "
        f"{len(read) - with_content}); answered: a 200 with a non-empty answer, recall on"
    )
    header_ms = [a.recall_ms / a.rounds for a in every["on"] if a.recall_ms and a.rounds]
    if header_ms:
        lines.append(
            f"a recall round's proxy time (x-compaction-recall-ms): median "
            f"{statistics.median(header_ms):.2f} ms, p90 {_p90(header_ms):.2f} ms over "
            f"{len(header_ms)} rounds"
        )
    if results.added_s:
        added = [s * 1000 for s in results.added_s]
        lines.append(
            f"from outside (client's wait less the upstream's, recall on less off): median "
            f"{statistics.median(added):.2f} ms, p90 {_p90(added):.2f} ms over {len(added)} "
            "questions that took one round (target <= 10 ms)"
        )
    if args.misses:
        for (dialect, stream, recall), answers in results.answered.items():
            for answered in answers:
                if recall == "on" and not answered.right and answered.question is not None:
                    lines.append(f"missed ({dialect}, stream {stream}, {answered.rounds} rounds):"
                                 f" {answered.question.text!r} {answered.question.required}"
                                 f" -> {answered.answer[:160]!r}")  # fmt: skip
    return "\n".join(lines)


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


async def run(args: argparse.Namespace) -> tuple[Results, list[Case]]:
    results = Results()
    cases = build_cases(args, results)
    await measure(cases, args.dialects, args.window, results)
    return results, cases


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="kit sessions per kind, seeds 1..N")
    parser.add_argument("--sessions", nargs="*", default=list(SESSIONS), choices=SESSIONS)
    parser.add_argument("--per-source", type=int, default=2, help="corpus trajectories per file")
    parser.add_argument("--questions", type=int, default=5, help="per corpus trajectory")
    parser.add_argument("--window", type=int, default=8000)
    parser.add_argument("--growth", type=int, default=4, help="windows grown before asking")
    parser.add_argument("--dialects", nargs="*", default=list(DIALECTS), choices=DIALECTS)
    parser.add_argument("--misses", action="store_true", help="print what recall on got wrong")
    return parser.parse_args(argv)


def main() -> None:
    args = parse()
    started = time.perf_counter()
    results, cases = asyncio.run(run(args))
    print(report(results, args.dialects, cases, args))
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
