"""The wire client's pool: keep-alive connections per origin, and a request sent over one.

- Connections are kept alive and pooled per origin; an idle one is dropped after `keepalive_s`,
  or as soon as the upstream closes it. A request is never sent twice.
- The head and a small body go out in one write. What the socket has not taken yet stays with
  the transport, and the response is read meanwhile: an upstream may answer (413) before it
  read the whole body.
- The response is read by proxy.http.wire.response: head, body framing, flow control.
- Timeouts as aiohttp's `connect` and `sock_read`: connecting, and each wait for bytes.
- Failures are `WireError`s, which proxy.http.upstream maps as it maps aiohttp's.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
from collections.abc import Mapping
from socket import SOCK_STREAM

from aiohappyeyeballs import start_connection
from yarl import URL

from proxy.http.wire.connection import Connection, WireError
from proxy.http.wire.response import WireResponse

_MAX_TUNNEL_HEAD = 16 * 1024  # a proxy's answer to CONNECT, headers included


class WirePool:
    """Keep-alive connections to the upstream's origins, and the requests sent over them."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float = 15.0,
        tls: ssl.SSLContext | None = None,
        tunnels: Mapping[str, URL] | None = None,
    ) -> None:
        """`tls`: how https origins are verified (default: the system's CAs, as aiohttp);
        `tunnels`: the HTTP proxy each https host is reached through (CONNECT), by host."""
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._open: set[Connection] = set()
        self._closed = False
        self._tls = tls
        self._tunnels = dict(tunnels or {})
        self._reaper: asyncio.TimerHandle | None = None

    async def request(
        self, method: str, url: URL, headers: Mapping[str, str], body: bytes
    ) -> WireResponse:
        """Send the request; return its response once the head arrived (body unread)."""
        if self._closed:
            raise WireError("closed")
        key = (url.scheme, url.raw_host or "", url.port or 0)
        connection = self._take_idle(key) or await self._connect(key)
        if self._closed:  # closed while connecting
            connection.close()
            raise WireError("closed")
        response = WireResponse(connection, self)
        connection.response = response
        try:
            connection.send(_head(method, url, headers, len(body)), body)
            await response.wait_head()
        except BaseException:
            response.close()
            raise
        return response

    async def close(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        for connection in list(self._open):
            connection.close()
        self._idle.clear()

    def _take_idle(self, key: tuple[str, str, int]) -> Connection | None:
        idle = self._idle.get(key)
        too_old = asyncio.get_running_loop().time() - self.keepalive_s
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be stale
            if connection.usable() and connection.idle_since >= too_old:
                return connection
            connection.close()
        return None

    def _reap(self) -> None:
        """Close the connections idle for `keepalive_s` (the oldest first in each list)."""
        self._reaper = None
        too_old = asyncio.get_running_loop().time() - self.keepalive_s
        for idle in self._idle.values():
            while idle and (idle[0].idle_since < too_old or not idle[0].usable()):
                idle.pop(0).close()
        if any(self._idle.values()):
            self._reaper = asyncio.get_running_loop().call_later(self.keepalive_s, self._reap)

    async def _connect(self, key: tuple[str, str, int]) -> Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = self.load_tls() if scheme == "https" else None
        connection = Connection(key, self._forget)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                # Each address in turn, the next tried 0.25 s after the last (happy eyeballs,
                # as aiohttp does): one address that swallows connects costs 0.25 s, not the
                # connect timeout.
                tunnel = self._tunnels.get(host) if tls else None
                to_host, to_port = (tunnel.raw_host or "", tunnel.port or 0) if tunnel else key[1:]
                addresses = await loop.getaddrinfo(to_host.strip("[]"), to_port, type=SOCK_STREAM)
                sock = await start_connection(addresses, happy_eyeballs_delay=0.25, interleave=1)
                if tunnel is not None:
                    await _open_tunnel(sock, tunnel, host, port)
                await loop.create_connection(
                    lambda: connection,
                    sock=sock,
                    ssl=tls,
                    server_hostname=host.strip("[]") if tls else None,
                )
        except TimeoutError:
            connection.close()
            raise WireError("connect_timeout") from None
        except OSError as exc:
            connection.close()
            raise WireError("connect") from exc
        self._open.add(connection)
        return connection

    def load_tls(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def release(self, connection: Connection) -> None:
        """A connection whose response was read whole, for the next request (unless part of
        the request is still unsent: the upstream answered before reading it all)."""
        if self._closed or not connection.usable() or connection.sending():
            connection.close()
            return
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        self._idle.setdefault(connection.key, []).append(connection)
        if self._reaper is None:
            self._reaper = loop.call_later(self.keepalive_s, self._reap)

    def _forget(self, connection: Connection) -> None:
        self._open.discard(connection)


async def _open_tunnel(sock: socket.socket, proxy: URL, host: str, port: int) -> None:
    """Ask the HTTP proxy on `sock` for a tunnel to host:port (CONNECT); WireError("connect")
    when it refuses. TLS to the origin then runs inside the tunnel."""
    loop = asyncio.get_running_loop()
    target = f"{host}:{port}"
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    if proxy.user is not None:
        secret = base64.b64encode(f"{proxy.user}:{proxy.password or ''}".encode()).decode()
        head += f"Proxy-Authorization: Basic {secret}\r\n"
    await loop.sock_sendall(sock, (head + "\r\n").encode("latin-1"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = await loop.sock_recv(sock, 4096)
        if not chunk or len(answer) > _MAX_TUNNEL_HEAD:
            sock.close()
            raise WireError("connect")
        answer += chunk
    status = answer.split(b"\r\n", 1)[0].split(b" ")
    if len(status) < 2 or status[1] != b"200":
        sock.close()
        raise WireError("connect")


def _head(method: str, url: URL, headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {url.host_port_subcomponent}\r\n"]
    for name, value in headers.items():
        lines.append(f"{name}: {value}\r\n")
    if "Accept" not in headers:
        lines.append("Accept: */*\r\n")  # what aiohttp adds
    lines.append(f"Content-Length: {length}\r\n\r\n")
    text = "".join(lines)
    # A CR or LF inside a name or value would end the header early (aiohttp refuses it too).
    if text.count("\n") != len(lines) + 2 or text.count("\r") != len(lines) + 2:
        raise ValueError("newline or carriage return in a header sent upstream")
    return text.encode("utf-8", "surrogateescape")
