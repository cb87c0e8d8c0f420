"""A Responses API response streamed as events, each with its `sequence_number` and most with an
`output_index`, across the rounds that answer the proxy's tool: the tool's call item events are
dropped, and a reasoning item's events wait for the item after it (dropped with a call of the
tool's: a reasoning item goes back to the API only with the item that followed it), later
items renumbered, one sequence; a round's `response.created` is withheld; the
terminal event tells the whole response (every item shown, the first's id, usage summed)."""

from __future__ import annotations

from proxy.dialects.base import Call
from proxy.dialects.events import StreamReader, named_event, typed_payload
from proxy.dialects.responses.recall import (
    Json,
    answer_calls,
    calls_tool,
    is_function_call,
    is_reasoning,
)
from proxy.dialects.usage import add_usage

_OPENING = ("response.created", "response.in_progress", "response.queued")
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


class ResponsesStream(StreamReader):
    """A Responses API response streamed as events. A round's response continues the first: its
    `response.created` and `response.in_progress` are withheld, its items numbered after those
    already shown, every event renumbered in one sequence, and the terminal event tells the
    whole response (the first's id, every item shown, usage summed)."""

    def __init__(self, tool: str) -> None:
        self._id: object = None
        self._sequence = 0
        self._items: list[Json] = []
        """The items shown to the client so far, as done."""
        self._shown = 0
        self._round = 0
        super().__init__(tool)

    def begin(self) -> None:
        super().begin()
        self._held_at: int | None = None
        """The upstream index of a reasoning item whose events wait for the next item."""
        self._held: list[Json] = []
        self._indices: dict[int, int | None] = {}
        self._shown_now = 0
        self._final: Json | None = None
        self._output: list[Json] = []

    @property
    def recall(self) -> list[Call]:
        return [
            Call(str(item.get("call_id")), item.get("arguments"))
            for item in self._output
            if calls_tool(item, self._tool)
        ]

    def read(self, event: bytes) -> bytes | None:
        payload = typed_payload(event)
        if payload is None:
            return event
        kind = payload["type"]
        if kind in _OPENING:
            if self._round:
                return None
            response = payload.get("response")
            if isinstance(response, dict) and self._id is None:
                self._id = response.get("id")
            return self._renumbered(event, payload, changed=False)
        if kind in _TERMINAL:
            return self._read_end(event, payload)
        index = payload.get("output_index")
        if not isinstance(index, int):
            return self._renumbered(event, payload, changed=False)
        settled = b""
        if kind == "response.output_item.added" and index not in self._indices:
            settled = self._settle(following=payload.get("item"))
            if is_reasoning(payload.get("item")):
                self._held_at = index
        if index == self._held_at:
            self._held.append(payload)
            return settled or None
        shown = self._shown_event(event, payload, index)
        return settled + (shown or b"") if settled else shown

    def _shown_event(self, event: bytes, payload: Json, index: int) -> bytes | None:
        shown = self._index(index, payload)
        if shown is None:
            return None
        changed = shown != index or not event  # a held event is written anew
        payload["output_index"] = shown
        if payload["type"] == "response.output_item.done" and isinstance(payload.get("item"), dict):
            self._output.append(payload["item"])
            self._items.append(payload["item"])
        return self._renumbered(event, payload, changed=changed)

    def _settle(self, following: object) -> bytes:
        """The held reasoning item's events, now that the item after it starts (`following`;
        None: the response ends): withheld with a call of the tool's, since a reasoning item
        goes back to the API only with the item that followed it; shown otherwise."""
        at, held = self._held_at, self._held
        self._held_at, self._held = None, []
        if at is None:
            return b""
        if calls_tool(following, self._tool):
            self._indices[at] = None
            return b""
        return b"".join(self._shown_event(b"", p, at) or b"" for p in held)

    def _index(self, index: int, payload: Json) -> int | None:
        """The client's index of the upstream's item `index` (None: a call of the tool's)."""
        if index not in self._indices:
            item = payload.get("item")
            if is_function_call(item):
                if item.get("name") == self._tool:
                    self._indices[index] = None
                    return None
                self._clients += 1
            self._indices[index] = self._shown + self._shown_now
            self._shown_now += 1
        return self._indices[index]

    def _read_end(self, event: bytes, payload: Json) -> bytes | None:
        settled = self._settle(following=None)
        ended = self._read_terminal(event, payload)
        return settled + ended if settled and ended else settled or ended

    def _read_terminal(self, event: bytes, payload: Json) -> bytes | None:
        response = payload.get("response")
        if not isinstance(response, dict):
            return self._renumbered(event, payload, changed=False)
        self._spent = response.get("usage")
        if self._first_usage is None:
            self._first_usage = self._spent
        # Its own output as the upstream completed it (reasoning items' encrypted content too).
        output = response.get("output")
        if isinstance(output, list):
            self._output = [item for item in output if isinstance(item, dict)]
        if self.recall and not self._clients and payload["type"] == "response.completed":
            self._holding, self._final = True, payload
            return None
        if not self._round and not self.recall:
            return self._renumbered(event, payload, changed=False)
        return self._ended(payload)

    def _ended(self, payload: Json) -> bytes:
        response = dict(payload["response"])
        response["output"] = [item for item in self._items if not calls_tool(item, self._tool)]
        if self._id is not None:
            response["id"] = self._id
        if self._prior is not None:
            response["usage"] = add_usage(self._prior, response.get("usage"))
        return self._renumbered(b"", {**payload, "response": response}, changed=True) or b""

    def _renumbered(self, event: bytes, payload: Json, *, changed: bool) -> bytes | None:
        if "sequence_number" in payload:
            if payload["sequence_number"] != self._sequence:
                payload["sequence_number"] = self._sequence
                changed = True
            self._sequence += 1
        return named_event(str(payload["type"]), payload) if changed else event

    def continue_with(self, payload: Json, answered: list[tuple[Call, str]]) -> None:
        answer_calls(payload["input"], self._output, answered)
        final = self._final.get("response") if self._final else None
        self._prior = add_usage(
            self._prior, final.get("usage") if isinstance(final, dict) else None
        )
        self._shown += self._shown_now
        self._round += 1

    def ending(self) -> bytes:
        if not self._holding or self._final is None:
            return b""
        return self._ended(self._final)
