"""The byte-length bound that lets small bodies skip parsing: a part with a fixed token cost
(image, audio, file, document), or an output reservation that the window cannot hold beside the
body, must still send a small body to the parser."""

from __future__ import annotations

import orjson
import pytest

from proxy.compacting.decision.request import may_need_parsing


def _small(part_type: str) -> bytes:
    content = [{"type": part_type, part_type: {"data": "x"}}, {"type": "text", "text": "hi"}]
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})


def _decide(body: bytes) -> bool:
    return may_need_parsing(body, smallest_window=128_000, lowest_tokens=0.6 * 128_000, factor=1.2)


@pytest.mark.parametrize(
    "part_type",
    ["image_url", "input_audio", "file", "input_image", "input_file", "image", "document"],
)
def test_a_small_body_with_a_fixed_cost_part_is_parsed(part_type: str) -> None:
    assert _decide(_small(part_type))


@pytest.mark.parametrize("part_type", ["text", "imagery", "files", "documents"])
def test_a_small_body_without_one_is_not(part_type: str) -> None:
    assert not _decide(_small(part_type))


def test_a_body_near_the_window_is_parsed() -> None:
    assert _decide(b" " * 70_000)


def _reserving(*reservations: tuple[str, int]) -> bytes:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]'
    for key, tokens in reservations:
        body += f', "{key}" : {tokens}'.encode()
    return body + b"}"


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens", "max_output_tokens"])
def test_a_small_body_is_parsed_when_its_reservation_cannot_fit_beside_it(key: str) -> None:
    assert _decide(_reserving((key, 127_990)))
    assert not _decide(_reserving((key, 4_096)))


def test_every_reservation_counts_not_only_the_first() -> None:
    # A JSON parser keeps the last of a key given twice; the bound must not trust the first.
    assert _decide(_reserving(("max_tokens", 10), ("max_tokens", 127_990)))
    assert _decide(_reserving(("max_tokens", 127_990), ("max_tokens", 10)))


def test_a_fixed_cost_part_after_a_small_reservation_is_still_found() -> None:
    body = _reserving(("max_tokens", 10))[:-1] + b', "x": [{"type": "image_url"}]}'
    assert _decide(body)
