"""Moving bytes: routes' handlers, the edge around them, forwarding, relay, headers, encodings,
sessions, admin, and `upstream` (the one place the upstream's client errors become ours; its
requests go by aiohttp's client, or by `wire` for bodies held in memory).

Nothing here imports proxy.compacting: what changes a request reaches http only through the
protocol in proxy.hook.
"""
