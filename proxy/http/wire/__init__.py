"""The proxy's own HTTP/1.1 client, for requests whose body was already read whole (the hooked
routes'): an optimisation that replaces aiohttp's client where its per-request cost showed.

aiohttp's client executes some 360k instructions per small request (callgrind: its request and
response objects, a task per body write, a timer per read, tracing hooks), more than half of
what a whole pass-through costs; this one executes about a quarter of that. It does one thing:
send a request with a known body to the one upstream and hand back its response as it arrives.
Streamed request bodies and the proxy's own summary calls keep using aiohttp
(proxy.http.upstream, the only user of this package, and the one place its errors are mapped).

This package is the one entry point; remove it (and its branch in upstream.py) when aiohttp's
client catches up. Inside, one job per module:

- `pool`: keep-alive connections per origin, and sending a request over one;
- `connection`: one connection's socket (asyncio protocol), and `WireError`, what can fail;
- `response`: reading one response off a connection (head, framing, flow control).
"""

from proxy.http.wire.connection import WireError
from proxy.http.wire.pool import WirePool
from proxy.http.wire.response import WireResponse

__all__ = ["WireError", "WirePool", "WireResponse"]
