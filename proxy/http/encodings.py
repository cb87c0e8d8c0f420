"""Content codings of bodies the proxy reads itself (an upstream error it inspects, a usage
probe, a summary answer). Relayed bodies are never decoded: their bytes and `Content-Encoding`
travel together. Request bodies are decoded by aiohttp's server (see proxy.http.headers); one
that does not decode is the client's error (`unreadable_body`).
"""

from __future__ import annotations

import zlib

from proxy.errors import BadContentEncoding, UnreadableBody

# A decoded body larger than this is cut: we only ever read error bodies, usage and summaries.
_MAX_DECODED_BYTES = 8 * 1024 * 1024


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


def unreadable_body(content_encoding: str) -> UnreadableBody:
    """The 400 for a request body aiohttp's server could not read (its RequestPayloadError):
    with a Content-Encoding, the body was not in it; without, the framing was broken."""
    encoding = content_encoding.strip().lower()
    if encoding:
        return BadContentEncoding(
            f"the request body could not be decoded as its Content-Encoding says ({encoding})"
        )
    return UnreadableBody("the request body is malformed (broken chunked framing)")
