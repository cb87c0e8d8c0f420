"""build_ledger gathers requests, files and values in one pass each: the same ledger as adding
the items one by one (the definition below, as build_ledger was written before)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.corpus import read_corpus
from compaction.instructions import Instruction, find_instructions
from compaction.ledger import Ledger, _describe, build_ledger, outcome_of
from compaction.mentions import Mentions, scan_prose
from compaction.messages import Item, ToolCall, read_items
from compaction.scan import (
    call_commands_and_paths,
    command_key,
    fenced_commands,
    find_paths,
    first_lines,
    without_programs,
)
from compaction.text import sentences_holding


class _OneByOne:
    """The ledger item by item: each item adds its request, calls, outcomes, files, values."""

    def __init__(self) -> None:
        self.requests: dict[str, None] = {}
        self.calls: list[str] = []
        self.outcomes: list[str] = []
        self.pending: dict[str, int] = {}
        self.files: dict[str, None] = {}
        self.values: dict[str, None] = {}
        self.instructions: list[Instruction] = []

    def add(self, item: Item, mentions: Mentions | None) -> None:
        if item.kind == "tool":
            self._answer(item.answers, item.text)
        elif item.observation:
            self._answer(("shell",), item.text)
        elif item.is_request:
            request = first_lines(item.text)
            if request:
                self.requests[request] = None
            self.instructions += find_instructions([item])
            if mentions is not None:  # a user's value: its sentence, unless that is the request
                found = sentences_holding(item.text, mentions[1])
                mentions = (mentions[0], tuple(s for s in found if s != request))
            self._add_prose(mentions)
        elif item.kind == "assistant":
            self._add_prose(mentions)
            if not item.joins:
                self.pending = {}
            for command in fenced_commands(item.text):
                self._call("shell", f"$ {command_key(command)}")
                self.files.update(dict.fromkeys(find_paths(without_programs(command))))
            for call in item.functions:
                self._call(call.id or "", _describe(call))
                self.files.update(dict.fromkeys(call_commands_and_paths(call)[1]))

    def _call(self, key: str, text: str) -> None:
        self.pending[key] = len(self.calls)
        self.calls.append(text)
        self.outcomes.append("")

    def _answer(self, answers: Sequence[str], text: str) -> None:
        index = next((self.pending.pop(a) for a in answers if a in self.pending), None)
        if index is None:
            self._call("", "(an earlier call)")
            index = len(self.calls) - 1
            del self.pending[""]
        self.outcomes[index] = outcome_of(text)

    def _add_prose(self, mentions: Mentions | None) -> None:
        if mentions is not None:
            self.files.update(dict.fromkeys(mentions[0]))
            self.values.update(dict.fromkeys(mentions[1]))

    def ledger(self) -> Ledger:
        trail = (f"{c} → {o}" if o else c for c, o in zip(self.calls, self.outcomes, strict=True))
        return Ledger(
            requests=tuple(self.requests),
            trail=tuple(dict.fromkeys(trail)),
            files=tuple(self.files),
            values=tuple(v for v in self.values if v not in self.files),
            instructions=tuple(self.instructions),
        )


def _one_by_one(items: Sequence[Item], indices: Sequence[int]) -> Ledger:
    collector = _OneByOne()
    for i in indices:
        item = items[i]
        collector.add(item, scan_prose([item.text])[0] if item.is_prose else None)
    return collector.ledger()


def test_the_ledger_of_every_corpus_conversation_is_the_one_by_one_ledger(
    corpus_dir: Path,
) -> None:
    checked = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in read_corpus(path):
            items = read_items(conversation["messages"])
            indices = range(1, len(items))  # a fold's span: the system prompt left out
            ledger = build_ledger(items, indices)
            assert ledger == _one_by_one(items, indices)
            checked += bool(ledger.trail) + bool(ledger.files) + bool(ledger.values)
    assert checked > 100


_TEXTS = st.sampled_from(
    [
        "",
        "please fix src/app.py for order 12345",
        "THOUGHT: run it\n```bash\ncd /repo && pytest tests/test_app.py\n```",
        "```sh\nls /etc\n```\nand ```bash\ncat a/b/c.txt\n```",
        "<returncode>1</returncode>\n<output>\nValueError: bad 42\n</output>",
        '{"user_id": "mia_li_3668", "reservation_id": "NO6JO3"}',
        "id ab12cd34 and v1.2.3 in docs/guide.md",
        "exit code 2\nerror: boom",
    ]
)
_CALLS = st.lists(
    st.builds(
        ToolCall,
        st.sampled_from([None, "a", "b", "c"]),
        st.sampled_from([None, "bash", "get_user", "str_replace_editor"]),
        st.sampled_from(['{"command": "ls src/x.py"}', '{"path": "/a/b.py"}', "not json", "{}"]),
    ),
    max_size=3,
).map(tuple)
_ITEMS = st.builds(
    Item,
    st.sampled_from(["head", "user", "assistant", "tool", "summary", "other"]),
    _TEXTS,
    _CALLS,
    st.lists(st.sampled_from(["a", "b", "c", "shell"]), max_size=2).map(tuple),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["", "user"]),
)


@settings(max_examples=300)
@given(st.lists(_ITEMS, max_size=12), st.data())
def test_the_ledger_of_any_items_is_the_one_by_one_ledger(
    items: list[Item], data: st.DataObject
) -> None:
    assert build_ledger(items, range(len(items))) == _one_by_one(items, range(len(items)))
    some = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=12)) if items else []
    assert build_ledger(items, some) == _one_by_one(items, some)
