"""A bare HTTP/1.1 client for requests a normal client library would tidy up (dot segments,
odd paths, bytes in a header that are not UTF-8): the request line goes out exactly as
written."""

from __future__ import annotations

import asyncio


async def raw_request(
    port: int, method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    # Lone surrogates (from surrogateescape) go out as the raw bytes they stand for.
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, payload
