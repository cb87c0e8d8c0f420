"""Moving bytes: routes' handlers, the middleware around them, forwarding, relay, headers,
encodings, sessions, admin, the typed `keys` of the app's state, and `upstream` (the one place
the upstream's client errors become ours; its requests go by aiohttp's client, or by the `wire`
package for bodies already read whole).

Nothing here imports proxy.compacting: what changes a request reaches http only through the
protocol in proxy.interception.
"""
