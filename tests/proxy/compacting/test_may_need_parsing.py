"""The byte-length bound that lets small bodies skip parsing: a part with a fixed token cost
(image, audio, file, document) must still send a small body to the parser."""

from __future__ import annotations

import orjson
import pytest

from proxy.compacting.request import may_need_parsing


def _small(part_type: str) -> bytes:
    content = [{"type": part_type, part_type: {"data": "x"}}, {"type": "text", "text": "hi"}]
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})


def _decide(body: bytes) -> bool:
    return may_need_parsing(body, smallest_window=128_000, lowest_ratio=0.6, factor=1.2)


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
