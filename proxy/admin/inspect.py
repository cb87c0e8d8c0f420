"""`compaction-proxy inspect [SESSION]`: the dashboard's views in a terminal, read from a running
proxy's admin API (/admin/api/, proxy.admin.dashboard).

Without SESSION: the live figures and a table of sessions. With one: its totals, its timeline
and its last compaction's receipt (summary, memory written, diff). The admin token comes from
`--token` or the environment (TOKEN_VARIABLES, first set wins) and is never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import quote

import aiohttp

DEFAULT_URL = "http://127.0.0.1:8080"
TOKEN_VARIABLES = ("COMPACTION_PROXY_ADMIN_TOKEN", "COMPACTION_PROXY__ADMIN__TOKEN")
URL_VARIABLE = "COMPACTION_PROXY_URL"
_TIMEOUT = aiohttp.ClientTimeout(total=30)
_PREVIEW = 100


class InspectError(Exception):
    """What stops `inspect`: said in one line, exit status 1."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "inspect", help="sessions, a session's timeline and last compaction, from a running proxy"
    )
    parser.add_argument("session", nargs="?", help="a session id (default: the sessions table)")
    parser.add_argument(
        "--url", help=f"the running proxy (default: ${URL_VARIABLE} or {DEFAULT_URL})"
    )
    parser.add_argument(
        "--token", help=f"admin.token (default: ${TOKEN_VARIABLES[0]} or ${TOKEN_VARIABLES[1]})"
    )
    parser.add_argument("--sort", default="last_seen", help="sessions table order (a column)")
    parser.add_argument("--limit", type=int, default=30, help="sessions table rows")
    parser.add_argument(
        "--search", default="", help="only sessions whose id, dialect or model has it"
    )


def main(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    token = args.token or next((environ[v] for v in TOKEN_VARIABLES if environ.get(v)), None)
    if not token:
        print(
            f"compaction-proxy inspect: no admin token: pass --token or set {TOKEN_VARIABLES[0]}",
            file=sys.stderr,
        )
        return 2
    url = args.url or environ.get(URL_VARIABLE) or DEFAULT_URL
    try:
        asyncio.run(inspect(url, token, args.session, out, args.sort, args.limit, args.search))
    except InspectError as exc:
        print(f"compaction-proxy inspect: {exc}", file=sys.stderr)
        return 1
    return 0


async def inspect(
    url: str,
    token: str,
    session: str | None,
    out: TextIO,
    sort: str = "last_seen",
    limit: int = 30,
    search: str = "",
) -> None:
    """Write the sessions table (`session` None) or one session's views to `out`."""
    base = url.rstrip("/") + "/admin/api/"
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers, timeout=_TIMEOUT) as client:
        if session is None:
            live = await _get(client, base + "live")
            query = {"sort": sort, "limit": str(limit), "q": search}
            page = await _get(client, base + "sessions", query)
            out.write(render_sessions(page, live))
        else:
            found = await _get(client, base + "sessions/" + quote(session, safe=""))
            out.write(render_session(found))


async def _get(
    client: aiohttp.ClientSession, url: str, query: Mapping[str, str] | None = None
) -> Any:
    try:
        async with client.get(url, params=query) as response:
            payload = await response.json(content_type=None)
            status = response.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise InspectError(f"cannot read {url}: {exc.__class__.__name__}: {exc}") from exc
    if status == 401:
        raise InspectError("the admin token was refused (401)")
    if status != 200:
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        raise InspectError(f"{status} from {url}: {error.get('message', 'no message')}")
    return payload


# -- rendering --------------------------------------------------------------------------------


def render_sessions(page: Mapping[str, Any], live: Mapping[str, Any]) -> str:
    lines = [
        f"requests {_n(live['requests'])}  in flight {_n(live['in_flight'])}  "
        f"overhead p50/p99 {_pair(live['overhead_ms'])} ms  "
        f"upstream p50/p99 {_pair(live['upstream_latency_ms'])} ms  "
        f"loop lag p50/p99 {_pair(live['loop_lag_ms'])} ms  "
        f"queue {_n(live['background_tasks'])}  "
        f"state {'healthy' if live['state']['healthy'] else 'DEGRADED'}",
        "",
    ]
    rows = [
        (
            s["session_id"],
            s["dialect"] or "-",
            s["model"] or "-",
            _n(s["requests"]),
            _n(s["records_total"]),
            _n(s["tokens_sent"]),
            _n(s["tokens_forwarded"]),
            _n(s["tokens_saved"]),
            f"${s['money_saved']:.4f}",
            f"{_n(s['summarizer_calls'])}/{_n(s['summarizer_failures'])}",
            s["last_seen"],
        )
        for s in page["sessions"]
    ]
    header = (
        "session", "dialect", "model", "requests", "compactions", "sent", "forwarded",
        "saved", "money saved", "summarizer/failed", "last activity",
    )  # fmt: skip
    lines += _table(header, rows, numeric=range(3, 10))
    shown = len(page["sessions"])
    lines.append(f"{shown} of {page['total']} sessions")
    return "\n".join(lines) + "\n"


def render_session(found: Mapping[str, Any]) -> str:
    lines = [
        f"session {found['session_id']}  {found['dialect'] or '-'}  {found['model'] or '-'}",
        f"requests {_n(found['requests'])}  compactions {_n(found['records_total'])}  "
        f"tokens sent {_n(found['tokens_sent'])}  forwarded {_n(found['tokens_forwarded'])}  "
        f"saved {_n(found['tokens_saved'])} (${found['money_saved']:.4f})  "
        f"summarizer {_n(found['summarizer_calls'])}/{_n(found['summarizer_failures'])} failed",
        f"window {_n(found['window'])}  trigger {_n(found['trigger'])}  "
        f"last activity {found['last_seen']}",
        "",
        "timeline",
    ]
    window = found["window"]
    rows = [
        (
            e["time"],
            e["status"],
            _n(e["tokens_before"])
            if e["tokens_before"] is not None
            else f"~{_n(e['bytes_before'])} B",
            _n(e["tokens_after"])
            if e["tokens_after"] is not None
            else f"~{_n(e['bytes_after'])} B",
            f"{100 * e['tokens_after'] / window:.0f}%" if e["tokens_after"] is not None else "-",
            str(e["upstream_status"]),
            f"{e['overhead_ms']:.2f}",
        )
        for e in found["timeline"]
    ]
    header = ("time", "status", "sent", "forwarded", "of window", "upstream", "overhead ms")
    lines += _table(header, rows, numeric=range(2, 7))
    records: Sequence[Mapping[str, Any]] = found["records"]
    lines.append("")
    if not records:
        lines.append("no compaction yet")
    else:
        lines += _receipt(records[-1])
    return "\n".join(lines) + "\n"


def _receipt(record: Mapping[str, Any]) -> list[str]:
    folded = record.get("folded_range")
    lines = [
        f"last compaction {record['id']}  {record['time']}  reason {record['reason']}  "
        f"path {record['path']}",
        f"tokens {_n(record['tokens_before'])} -> {_n(record['tokens_after'])}  "
        f"messages {_n(record['messages_before'])} -> {_n(record['messages_after'])}  "
        f"folded {_n(record['folded_messages'])}"
        + (f" [{folded[0]}, {folded[1]})" if folded else ""),
        f"verification {record['quality'] or '-'} "
        f"({_n(record['key_decisions_preserved'])}/{_n(record['key_decisions_total'])} decisions)",
        f"standing instructions without room {_n(record.get('pinned_overflow'))}",
    ]
    for error in record.get("errors") or ():
        lines.append(f"summarizer error: {error}")
    lines += ["", "summary as sent:"]
    lines += ["  " + line for line in (record.get("summary") or "").splitlines()]
    lines += ["", "memory items written:"]
    lines += [
        f"  {i['type']}: {' '.join(i['content'].split())[:_PREVIEW]}"
        for i in record.get("memory_written") or ()
    ]
    diff = record.get("diff") or {}
    lines += [
        "",
        f"diff: {_n(diff.get('removed_total'))} messages as sent -> "
        f"{_n(diff.get('added_total'))} as forwarded, {_n(diff.get('kept'))} kept unchanged",
    ]
    for sign, side, total in (("-", "removed", "removed_total"), ("+", "added", "added_total")):
        items = diff.get(side) or []
        for item in items:
            preview = " ".join(item["preview"].split())[:_PREVIEW]
            lines.append(f"{sign} [{item['index']}] {item['role']}: {preview}")
        if (diff.get(total) or 0) > len(items):
            lines.append(f"{sign} ... {diff[total] - len(items)} more")
    return lines


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: range) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in numeric else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _n(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}" if isinstance(value, int | float) else str(value)


def _pair(figures: Mapping[str, float | None]) -> str:
    return f"{_n(figures['p50'])}/{_n(figures['p99'])}"
