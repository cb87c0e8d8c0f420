"""The request body decoder: bounded steps, every coding, several members or frames, and bodies
that are not in their coding."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import brotli
import pytest
from backports import zstd

from proxy.errors import BadContentEncoding
from proxy.http.encodings import DECODE_STEP, BodyDecoder, encode_body

TEXT = b'{"messages": [' + b'{"role": "user", "content": "hello there"},' * 40_000 + b"{}]}"

CODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstd.compress,
}


def _decoded(coding: str, data: bytes, chunk: int = 1000) -> list[bytes]:
    decoder = BodyDecoder(coding)
    pieces = [p for i in range(0, len(data), chunk) for p in decoder.pieces(data[i : i + chunk])]
    decoder.finish()
    return pieces


@pytest.mark.parametrize("coding", sorted(CODERS))
def test_a_body_decodes_whole_and_no_step_is_larger_than_the_step(coding: str) -> None:
    pieces = _decoded(coding, CODERS[coding](TEXT), chunk=len(TEXT))
    assert b"".join(pieces) == TEXT
    assert max(map(len, pieces)) <= DECODE_STEP


def test_raw_deflate_without_the_zlib_wrapper_is_read_too() -> None:
    coder = zlib.compressobj(6, zlib.DEFLATED, -15)
    assert b"".join(_decoded("deflate", coder.compress(TEXT) + coder.flush())) == TEXT


@pytest.mark.parametrize(
    ("coding", "data"),
    [
        ("gzip", gzip.compress(TEXT[:100]) + gzip.compress(TEXT[100:])),
        ("zstd", zstd.compress(TEXT[:100]) + zstd.compress(TEXT[100:])),
    ],
)
def test_several_gzip_members_or_zstd_frames_are_one_body(coding: str, data: bytes) -> None:
    assert b"".join(_decoded(coding, data)) == TEXT


@pytest.mark.parametrize("coding", sorted(CODERS))
def test_a_body_cut_short_is_refused(coding: str) -> None:
    data = CODERS[coding](TEXT)
    with pytest.raises(BadContentEncoding, match=coding):
        _decoded(coding, data[: len(data) // 2])


@pytest.mark.parametrize("coding", sorted(CODERS))
def test_an_empty_body_is_empty(coding: str) -> None:
    assert _decoded(coding, b"") == []


@pytest.mark.parametrize("coding", sorted(CODERS))
def test_what_is_encoded_again_decodes_to_the_same(coding: str) -> None:
    assert b"".join(_decoded(coding, encode_body(TEXT, coding))) == TEXT
