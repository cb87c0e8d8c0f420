"""How the proxy reaches its upstream: its two clients (aiohttp's pooled ClientSession, and the
wire client for bodies in memory, proxy.http.wire), how they verify https origins, and the
egress proxy the environment names (HTTPS_PROXY, HTTP_PROXY, NO_PROXY), honoured by both when
`upstream.trust_env` is on: the wire client tunnels to https origins (CONNECT), and a plain http
origin behind a proxy is left to aiohttp, which forwards to it."""

from __future__ import annotations

import ssl
from collections.abc import Iterable

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from proxy.http.wire import WirePool
from proxy.settings import UpstreamSettings


def open_clients(
    settings: UpstreamSettings, bases: Iterable[str], tls: ssl.SSLContext | None
) -> tuple[aiohttp.ClientSession, WirePool, frozenset[str]]:
    """Both clients for the upstreams at `bases`, and the hosts the wire client leaves to
    aiohttp (http origins behind the environment's proxy). `tls`: how https origins are
    verified (default: the system's CAs)."""
    bases = tuple(bases)
    proxies = proxies_for(bases) if settings.trust_env else {}
    wire = WirePool(
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.timeout_s,
        tls=tls,
        tunnels={host: proxy for host, (scheme, proxy) in proxies.items() if scheme == "https"},
    )
    if any(base.startswith("https") for base in bases):
        wire.load_tls()  # ~20 ms (the system's CAs): not on the first request
    left = frozenset(host for host, (scheme, _) in proxies.items() if scheme == "http")
    return open_session(settings, tls), wire, left


def open_session(
    settings: UpstreamSettings, tls: ssl.SSLContext | None = None
) -> aiohttp.ClientSession:
    """The app's one ClientSession: pooled, no total timeout (streams may run long), a connect
    timeout and a per-read timeout, bodies left compressed, no cookies kept across clients, no
    redirects followed (a redirect is the upstream's answer and goes back to the client), the
    environment's proxies when `upstream.trust_env` says so. `tls`: how https origins are
    verified (default: the system's CAs)."""
    return aiohttp.ClientSession(
        # limit=0: no cap of our own on concurrent upstream connections; a cap here would queue
        # long-running streams of unrelated clients behind each other.
        connector=aiohttp.TCPConnector(
            limit=0, enable_cleanup_closed=False, ssl=tls if tls is not None else True
        ),
        trust_env=settings.trust_env,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout_s, sock_read=settings.timeout_s
        ),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        # Transparency: send exactly the client's headers (no added User-Agent/Accept-Encoding).
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )


def proxies_for(bases: Iterable[str]) -> dict[str, tuple[str, URL]]:
    """By host, the scheme of each of `bases` that the environment (HTTPS_PROXY, HTTP_PROXY,
    NO_PROXY; read once, at start) sends through a proxy, and that proxy: aiohttp's own reading
    of them, so both clients agree."""
    found = {}
    for base in bases:
        url = URL(base)
        try:
            proxy, auth = get_env_proxy_for_url(url)
        except LookupError:  # no proxy for it, or NO_PROXY names it
            continue
        if auth is not None:
            proxy = proxy.with_user(auth.login).with_password(auth.password)
        if url.host:
            found[url.host] = (url.scheme, proxy)
    return found
