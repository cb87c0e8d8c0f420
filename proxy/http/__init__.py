"""Moving bytes: routes' handlers, the edge around them, forwarding, relay, headers, encodings,
sessions, admin, and `upstream` (the one place aiohttp client errors become ours).

Nothing here imports proxy.compacting: what changes a request reaches http only through the
protocol in proxy.hook.
"""
