"""bench.bombs builds its bombs by repeating a coder's output: each must decode, in full, to
exactly the zeros asked for (decoded here in bounded steps, never held whole)."""

from __future__ import annotations

import pytest

from bench.bombs import bomb
from proxy.http.encodings import BodyDecoder


@pytest.mark.parametrize("encoding", ["br", "gzip", "zstd"])
def test_a_bomb_decodes_to_the_zeros_asked_for(encoding: str) -> None:
    size = 3 << 24  # 48 MiB: three of the 16 MiB blocks a bomb repeats
    data = bomb(encoding, size)
    assert len(data) < size // 500
    decoder = BodyDecoder(encoding)
    decoded = 0
    for piece in decoder.pieces(data):
        assert piece.count(0) == len(piece)
        decoded += len(piece)
    decoder.finish()  # gzip's trailer (checksum and length) and each stream's end hold
    assert decoded == size
