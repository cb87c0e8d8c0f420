"""The recall rounds of one request (a proxy.interception.Followup): the upstream's response
calls `recall`, the proxy answers the call from the archive, appends the call and its result to
the request and calls the upstream again, at most `max_rounds` times; the client receives one
ordinary response without any recall call.

- A response that calls `recall` beside the client's own tools: the client's calls only.
- A round that fails (the upstream unreachable or answering an error, a body that is not a
  response): the client gets what it would have got without recall, the first response minus
  its recall call, never an error of ours.
- Rounds exhausted: the last response minus its recall call.
- `usage` of the final response is the sum of every call's (the request really cost that); the
  `id` is the first response's. The rounds, their tokens and the proxy's own time in them go
  back as `RecallFigures` (proxy.outcome renders them into the client's headers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import orjson

from proxy.dialects import Dialect, JsonObject, StreamedTurn, add_usage, read_events
from proxy.errors import ProxyError, UpstreamStreamCut
from proxy.interception import Body, Followed, Resend, Response, Usage
from proxy.metrics import RecallMetrics
from proxy.outcome import RecallFigures
from proxy.recall.answers import CHARS_PER_TOKEN, Answers
from proxy.recall.tools import NAME

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    room_tokens: int
    """What the window has left for recall results after the request and its output."""
    max_rounds: int


class RecallRounds:
    def __init__(
        self,
        dialect: Dialect,
        body: bytes,
        answers: Answers,
        budget: Budget,
        metrics: RecallMetrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`body`: the request as it went upstream (the recall tool included)."""
        self._dialect = dialect
        self._turns = dialect.turns(NAME)
        self._body = body
        self._answers = answers
        self._budget = budget
        self._metrics = metrics
        self._clock = clock

    async def follow(self, first: Response, upstream: Resend) -> Followed:
        content_type = first.headers.get("Content-Type", "")
        if content_type.startswith("text/event-stream"):
            followed = Followed(_Current(first), _empty(), rewritten=True)
            followed.chunks = self._stream(self._dialect.stream(NAME), followed, upstream)
            return followed
        try:
            raw = await upstream.read(first)
        except UpstreamStreamCut as cut:
            return Followed(first, _failing(cut.partial, cut), rewritten=True)
        response = _object(raw)
        if response is None:
            return _whole(first, raw)
        calls = self._turns.calls(response)
        usage = response.get("usage")
        if not calls.recall:
            return _whole(first, raw, usage=_usage(usage))
        try:
            return await self._rounds(first, response, upstream)
        except Exception:  # fail open: the response as it would have been without recall
            log.exception("answering a recall call failed; the client gets the response without it")
            self._metrics.given_up.labels(reason="error").inc()
            plain = orjson.dumps(self._turns.without_calls(response))
            return _whole(first, plain, usage=_usage(usage))

    async def _rounds(self, first: Response, response: JsonObject, upstream: Resend) -> Followed:
        turns, metrics = self._turns, self._metrics
        payload: JsonObject = orjson.loads(self._body)
        room = self._budget.room_tokens
        current, current_http = response, first
        rounds, tokens, proxy_s = 0, 0, 0.0
        total_usage: object = response.get("usage")
        final: JsonObject | None = None
        while final is None:
            calls = turns.calls(current)
            if not calls.recall:
                final = current
                break
            if calls.others or rounds >= self._budget.max_rounds:
                if not calls.others:
                    metrics.given_up.labels(reason="max_rounds").inc()
                final = turns.without_calls(current)
                break
            started = self._clock()
            answered = []
            for call in calls.recall:
                result = await self._answers.answer(call.arguments, room)
                room -= len(result) // CHARS_PER_TOKEN
                answered.append((call, result))
            turns.continue_with(payload, current, answered)
            body = orjson.dumps(payload)
            spent = self._clock() - started
            outcome = await self._send(upstream, body)
            if isinstance(outcome, str):
                metrics.given_up.labels(reason=outcome).inc()
                if current_http is not first:
                    current_http.release()
                current_http = first
                final = turns.without_calls(response)
                break
            next_http, next_raw = outcome
            started = self._clock()
            parsed = _object(next_raw)
            spent += self._clock() - started
            if parsed is None:
                next_http.release()
                metrics.given_up.labels(reason="unreadable").inc()
                if current_http is not first:
                    current_http.release()
                current_http = first
                final = turns.without_calls(response)
                break
            rounds += 1
            proxy_s += spent
            metrics.rounds.labels(dialect=self._dialect.name).inc()
            metrics.round_seconds.observe(spent)
            spent_in, spent_out = self._dialect.spent_tokens(parsed.get("usage"))
            metrics.tokens.labels(kind="input").inc(spent_in)
            metrics.tokens.labels(kind="output").inc(spent_out)
            tokens += spent_in + spent_out
            total_usage = add_usage(total_usage, parsed.get("usage"))
            if current_http is not first:
                current_http.release()
            current, current_http = parsed, next_http
        if current_http is not first:
            first.release()
        if rounds:
            final = turns.after_rounds(response, final)
            final = {**final, "id": response.get("id", final.get("id"))}
            if total_usage is not None:
                final["usage"] = total_usage
        recall = RecallFigures(rounds, tokens, proxy_s * 1000)
        log.info("answered recall calls", extra={"rounds": rounds, "dialect": self._dialect.name})
        return _whole(
            current_http, orjson.dumps(final), recall=recall, usage=_usage(response.get("usage"))
        )

    async def _stream(
        self, turn: StreamedTurn, followed: Followed, upstream: Resend
    ) -> AsyncIterator[bytes]:
        """The client's one stream: each upstream response's events as they arrive, rounds
        answered in between (the dialect's stream reader: proxy.dialects.StreamedTurn)."""
        current = followed.response
        assert isinstance(current, _Current)
        payload: JsonObject | None = None
        room = self._budget.room_tokens
        rounds, tokens, proxy_s = 0, 0, 0.0
        while True:
            async for event in read_events(upstream.chunks(current.response)):
                sent = turn.read(event)
                if sent:
                    yield sent
            followed.usage = _usage(turn.usage)
            if rounds:
                spent_in, spent_out = self._dialect.spent_tokens(turn.spent)
                self._metrics.tokens.labels(kind="input").inc(spent_in)
                self._metrics.tokens.labels(kind="output").inc(spent_out)
                tokens += spent_in + spent_out
            recall = turn.recall
            if not recall or turn.others or rounds >= self._budget.max_rounds:
                if recall and not turn.others:
                    self._metrics.given_up.labels(reason="max_rounds").inc()
                break
            started = self._clock()
            if payload is None:
                payload = orjson.loads(self._body)
            answered = []
            for call in recall:
                result = await self._answers.answer(call.arguments, room)
                room -= len(result) // CHARS_PER_TOKEN
                answered.append((call, result))
            turn.continue_with(payload, answered)
            body = orjson.dumps(payload)
            spent = self._clock() - started
            try:
                response = await upstream.send(body)
            except ProxyError:
                response = None
            if response is None or response.status != 200:
                if response is not None:
                    response.close()
                self._metrics.given_up.labels(reason="upstream_error").inc()
                break
            current.response.release()
            current.response = response
            turn.begin()
            rounds += 1
            proxy_s += spent
            self._metrics.rounds.labels(dialect=self._dialect.name).inc()
            self._metrics.round_seconds.observe(spent)
        ending = turn.ending()
        if ending:
            yield ending
        followed.recall = RecallFigures(rounds, tokens, proxy_s * 1000)

    async def _send(self, upstream: Resend, body: bytes) -> tuple[Response, bytes] | str:
        """The next response and its body, or why the round is given up."""
        try:
            response = await upstream.send(body)
        except ProxyError:
            return "upstream_error"
        if response.status != 200:
            response.close()
            return "upstream_error"
        try:
            return response, await upstream.read(response)
        except (UpstreamStreamCut, ProxyError):
            response.close()
            return "upstream_error"


def _object(raw: bytes) -> JsonObject | None:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _usage(usage: object) -> dict[str, object] | None:
    return usage if isinstance(usage, dict) else None


class _Current:
    """The upstream response a stream is reading now (each round's in turn): the relay releases
    or closes whichever it is when the client's stream ends."""

    def __init__(self, response: Response) -> None:
        self.response = response
        self.headers = response.headers
        self.status = response.status
        self.reason = response.reason

    @property
    def content(self) -> Body:
        return self.response.content

    def release(self) -> object:
        return self.response.release()

    def close(self) -> None:
        self.response.close()


async def _empty() -> AsyncIterator[bytes]:
    return
    yield


def _whole(
    response: Response,
    body: bytes,
    *,
    recall: RecallFigures | None = None,
    usage: Usage | None = None,
) -> Followed:
    """The client's response when its whole body is known: sent with its Content-Length."""
    return Followed(
        response, _once(body), rewritten=True, recall=recall, usage=usage, length=len(body)
    )


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _failing(partial: bytes, cut: UpstreamStreamCut) -> AsyncIterator[bytes]:
    if partial:
        yield partial
    raise cut
