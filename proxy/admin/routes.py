"""The admin endpoints: sessions, their compaction records and totals (proxy.admin.records:
every replica's with `state.backend: redis`), the search of a session's archived turns
(`admin.token` required).

They do not exist (404) while `admin.token` is null.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from proxy.errors import ArchiveUnavailable, BadRequest, NotFound, Unauthorized
from proxy.http import keys
from proxy.http.handlers import json_response
from proxy.http.middleware import GET_ONLY
from proxy.sessions import check_session_id
from proxy.state.archive import search_session


async def admin_sessions(request: web.Request) -> web.Response:
    require_admin(request)
    return json_response(await request.app[keys.RECORDS].read_list())


async def admin_session(request: web.Request) -> web.Response:
    require_admin(request)
    session_id = check_session_id(request.match_info["session"], "the path")
    # The timeline is the dashboard's (/admin/api/sessions/{session}).
    found = await request.app[keys.RECORDS].read_session(session_id, timeline=False)
    if found is None:
        raise NotFound(f"no session {session_id!r} seen (or it was evicted)")
    return json_response(found)


_MAX_LIMIT = 1000


async def admin_archive(request: web.Request) -> web.Response:
    """`?q=` searched in the session's archived turns (every credential's) and memory items,
    best first, at most `limit` (default `archive.search_limit`)."""
    require_admin(request)
    session_id = check_session_id(request.match_info["session"], "the path")
    settings = request.app[keys.SETTINGS]
    query = request.query.get("q", "")
    if not query.strip():
        raise BadRequest("q is required: the words to search the archive for")
    limit = _limit(request.query.get("limit"), settings.archive.search_limit)
    try:
        found = await search_session(
            request.app[keys.ARCHIVE],
            settings.memory.dir,
            session_id,
            query,
            tenant=None,
            limit=limit,
        )
    except Exception as exc:
        raise ArchiveUnavailable(
            f"the archive could not be searched ({type(exc).__name__})"
        ) from exc
    results = [item.describe() for item in found]
    if settings.admin.preview_chars == 0:  # what conversations say stays out of /admin
        results = [{**item, "text": "", "message": None} for item in results]
    return json_response({"session": session_id, "query": query, "results": results})


def _limit(raw: str | None, default: int) -> int:
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        raise BadRequest(f"limit must be an integer from 1 to {_MAX_LIMIT}") from None
    if not 1 <= limit <= _MAX_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {_MAX_LIMIT}")
    return limit


def require_admin(request: web.Request) -> None:
    """404 while admin is disabled (the endpoints do not exist, whatever the method: so they
    refuse other methods here, not in the middleware); 405 for a method other than GET or HEAD; 401
    without the right token."""
    token = request.app[keys.SETTINGS].admin.token
    if token is None:
        raise NotFound("admin endpoints are disabled (set admin.token to enable them)")
    if request.method not in GET_ONLY:
        raise web.HTTPMethodNotAllowed(request.method, GET_ONLY)
    sent = request.headers.get("Authorization", "")
    scheme, _, value = sent.partition(" ")
    # As sent: aiohttp reads bytes that are not UTF-8 as lone surrogates (surrogateescape).
    given = value.strip().encode("utf-8", "surrogateescape")
    if not (scheme.lower() == "bearer" and hmac.compare_digest(given, token.encode())):
        raise Unauthorized("missing or wrong admin token (Authorization: Bearer <admin.token>)")
