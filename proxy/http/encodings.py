"""Content codings, both ways: request bodies the proxy decodes itself, in bounded steps
(`BodyDecoder`, so a small body that decodes to gigabytes costs what the limit allows), and
puts back in the client's coding when it changed them (`encode_body`); bodies it reads from the
upstream (an error it inspects, a usage probe, a summary answer: `decode_body`). Relayed
response bodies are never decoded: their bytes and `Content-Encoding` travel together.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping

import brotli
from backports import zstd

from proxy.errors import BadContentEncoding

# A decoded body larger than this is cut: we only ever read error bodies, usage and summaries.
_MAX_DECODED_BYTES = 8 * 1024 * 1024

REQUEST_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
"""The request codings the proxy decodes (those aiohttp's server knows); a body in any other,
or in several, passes through as the client sent it."""

DECODE_STEP = 256 * 1024
"""The most one decoding step writes: the granularity at which a body's decoded size is
checked against its limit."""


def request_coding(headers: Mapping[str, str]) -> str:
    """The coding of a request body the proxy decodes, or "" (none, identity, or one it does
    not: those bodies are bytes it never reads)."""
    coding = headers.get("Content-Encoding", "").strip().lower()
    return coding if coding in REQUEST_CODINGS else ""


class BodyDecoder:
    """One request body's content coding undone as its bytes arrive, never more than
    `DECODE_STEP` bytes of output per step: the caller counts each piece against its limit and
    lets other work run between pieces. Several gzip members or zstd frames in a row decode as
    one body, as aiohttp's decoder does. A body that is not in its coding is a
    `BadContentEncoding`."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._zlib: zlib._Decompress | None = None
        self._brotli = brotli.Decompressor() if coding == "br" else None
        self._zstd = zstd.ZstdDecompressor() if coding == "zstd" else None
        self._fed = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of `data` (the body's next raw bytes), a step at a time."""
        self._fed = self._fed or bool(data)
        try:
            if self._brotli is not None:
                yield from _brotli_pieces(self._brotli, data)
            elif self._zstd is not None:
                yield from self._zstd_pieces(data)
            else:
                yield from self._zlib_pieces(data)
        except (zlib.error, brotli.error, zstd.ZstdError, EOFError):
            raise self._refused() from None

    def finish(self) -> None:
        """The body ended: refused when its coding had not (an empty body is empty)."""
        if not self._fed:
            return
        if self._brotli is not None:
            done = self._brotli.is_finished()
        elif self._zstd is not None:
            done = self._zstd.eof
        else:
            done = self._zlib is None or self._zlib.eof
        if not done:
            raise self._refused()

    def _zlib_pieces(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._zlib is None or self._zlib.eof:
                if self._zlib is not None and self.coding != "gzip":
                    raise zlib.error("data after the end of the deflate stream")
                self._zlib = zlib.decompressobj(_zlib_window(self.coding, data))
            decoder = self._zlib
            out = decoder.decompress(data, DECODE_STEP)
            # A full step may leave output inside zlib with no input left: ask again.
            while out:
                yield out
                if len(out) < DECODE_STEP or decoder.eof:
                    break
                out = decoder.decompress(decoder.unconsumed_tail, DECODE_STEP)
            data = decoder.unused_data if decoder.eof else decoder.unconsumed_tail

    def _zstd_pieces(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._zstd is None or self._zstd.eof:
                self._zstd = zstd.ZstdDecompressor()
            decoder = self._zstd
            yield decoder.decompress(data, DECODE_STEP)
            while not decoder.eof and not decoder.needs_input:
                yield decoder.decompress(b"", DECODE_STEP)
            data = decoder.unused_data if decoder.eof else b""

    def _refused(self) -> BadContentEncoding:
        return BadContentEncoding(
            f"the request body could not be decoded as its Content-Encoding says ({self.coding})"
        )


def _zlib_window(coding: str, data: bytes) -> int:
    """zlib's wbits for a body's first bytes: gzip's header, or for deflate the zlib wrapper
    RFC 9110 means, or the raw deflate some clients send (what aiohttp also accepts)."""
    if coding == "gzip":
        return 31
    return 15 if data[0] & 0x0F == 8 else -15


def _brotli_pieces(decoder: brotli.Decompressor, data: bytes) -> Iterator[bytes]:
    # The limit stops brotli's output buffer growing once reached, and it grows by doubling:
    # half a step keeps a piece within one. Output is pending while a call returns any (the one
    # sign brotli gives: can_accept_more_data() is True with output still inside).
    out = decoder.process(data, output_buffer_limit=DECODE_STEP // 2)
    while out:
        yield out
        if decoder.is_finished():
            break
        out = decoder.process(b"", output_buffer_limit=DECODE_STEP // 2)


def encode_body(data: bytes, coding: str) -> bytes:
    """`data` in `coding` (one of REQUEST_CODINGS), at a level that costs a few milliseconds per
    megabyte: a compacted body goes upstream in the coding its client chose."""
    if coding == "gzip":
        coder = zlib.compressobj(6, zlib.DEFLATED, 31)
        return coder.compress(data) + coder.flush()
    if coding == "deflate":
        return zlib.compress(data, 6)
    if coding == "br":
        return bytes(brotli.compress(data, quality=5))
    if coding == "zstd":
        return bytes(zstd.compress(data, level=3))
    raise ValueError(f"not a request coding: {coding!r}")


def decode_body(data: bytes, encoding: str) -> bytes | None:
    """`data` without its gzip/deflate content coding (bounded); None for other codings."""
    if encoding in ("", "identity"):
        return data
    if encoding not in ("gzip", "x-gzip", "deflate"):
        return None
    wbits = 47 if encoding != "deflate" else 15  # 47: gzip or zlib header, auto-detected
    try:
        decoder = zlib.decompressobj(wbits)
        out = decoder.decompress(data, _MAX_DECODED_BYTES)
    except zlib.error:
        if encoding != "deflate":
            return None
        try:  # some servers send raw deflate without the zlib header
            out = zlib.decompressobj(-15).decompress(data, _MAX_DECODED_BYTES)
        except zlib.error:
            return None
    return out
