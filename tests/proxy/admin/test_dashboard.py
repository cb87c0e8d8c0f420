"""The dashboard (proxy.admin.dashboard) over a proxy that compacted: its page and files, its
token, and the figures its JSON shows for sessions, a session's timeline and receipts, and live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.admin.dashboard import quantile_of_buckets
from tests.fakes.script import SUMMARY_TEXT, Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post
from tests.proxy.conftest import RunningProxy, StartProxy

ADMIN = {"Authorization": "Bearer admin-secret"}
PRICES = {"gpt-test": {"input": 10.0, "cached_input": 1.0, "output": 30.0}}


async def get_json(
    client: aiohttp.ClientSession, proxy: RunningProxy, path: str, status: int = 200
) -> Any:
    async with client.get(f"{proxy.url}/admin/api/{path}", headers=ADMIN) as response:
        assert response.status == status, await response.text()
        if status == 200:
            assert response.headers["Cache-Control"] == "no-store"
        return await response.json()


async def test_the_page_and_its_files_come_from_the_proxy_alone(
    start: Any, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    async with client.get(f"{proxy.url}/admin/") as response:
        assert response.status == 200
        assert response.content_type == "text/html"
        assert "default-src 'self'" in response.headers["Content-Security-Policy"]
        page = await response.text()
    # Everything it loads is relative to /admin/: no CDN, no other host.
    assert 'src="assets/dashboard.js"' in page and 'href="assets/dashboard.css"' in page
    assert "http://" not in page and "https://" not in page and "//" not in page.split("-->")[-1]
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        async with client.get(f"{proxy.url}/admin/assets/{name}") as response:
            assert response.status == 200 and response.content_type == kind
            assert "https://" not in await response.text()
    async with client.get(f"{proxy.url}/admin/assets/..%2Fdashboard.py") as response:
        assert response.status == 404
    async with client.post(f"{proxy.url}/admin/") as response:
        assert response.status == 405


async def test_the_dashboard_does_not_exist_without_a_token(
    start_proxy: StartProxy, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy()
    for path in ("/admin/", "/admin/assets/dashboard.js", "/admin/api/sessions", "/admin/api/live"):
        for method in ("GET", "POST"):
            async with client.request(method, f"{proxy.url}{path}", headers=ADMIN) as response:
                assert response.status == 404, (method, path)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Cookie": "token=admin-secret"}],
)
async def test_the_api_refuses_a_wrong_token_in_the_openai_error_shape(
    start: Any, client: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    proxy = await start()
    for path in ("sessions", "sessions/agent-1", "sessions/agent-1/memory", "live"):
        # A token in the query string is not one: it would end in access logs.
        url = f"{proxy.url}/admin/api/{path}?token=admin-secret"
        async with client.get(url, headers=headers) as response:
            assert response.status == 401, path
            error = (await response.json())["error"]
    assert error["code"] == "invalid_admin_token" and error["type"]


async def test_a_compacted_session_shows_its_figures_timeline_and_receipt(
    start: Any, script: Script, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    proxy = await start(models={"prices": PRICES}, compaction={"summary_request": "standalone"})
    await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    await post(client, proxy, conversation_of(200), session="quiet")

    page = await get_json(client, proxy, "sessions?sort=tokens_saved")
    assert page["total"] == 2
    compacted, quiet = page["sessions"]
    assert compacted["session_id"] == "agent-1" and quiet["session_id"] == "quiet"
    assert compacted["dialect"] == "chat" and compacted["model"] == "gpt-test"
    assert compacted["requests"] == 1 and compacted["records_total"] == 1
    assert compacted["tokens_sent"] > compacted["tokens_forwarded"] > 0
    saved = compacted["tokens_sent"] - compacted["tokens_forwarded"]
    assert compacted["tokens_saved"] == saved
    assert compacted["money_saved"] == round(saved * 10.0 / 1e6, 4)
    assert compacted["money_saved_cached"] == round(saved * 1.0 / 1e6, 4)
    assert compacted["summarizer_calls"] == 1 and compacted["summarizer_failures"] == 0
    assert quiet["tokens_saved"] == 0 and quiet["records_total"] == 0

    found = await get_json(client, proxy, "sessions/agent-1")
    assert found["window"] == WINDOW and found["trigger"] == int(WINDOW * 0.85)
    (entry,) = found["timeline"]
    (record,) = found["records"]
    assert entry["status"] == "applied" and entry["dialect"] == "chat"
    assert entry["tokens_before"] == record["tokens_before"] == compacted["tokens_sent"]
    assert entry["tokens_after"] == record["tokens_after"] == compacted["tokens_forwarded"]
    assert entry["compaction_id"] == record["id"]
    assert entry["bytes_after"] < entry["bytes_before"]
    assert entry["upstream_status"] == 200 and entry["overhead_ms"] >= 0
    # The receipt: the summary as sent, the memory written, and the diff as sent / forwarded.
    assert "Keep the standard library only." in record["summary"]
    assert len(record["summary"]) > len(record["summary_preview"]) or len(SUMMARY_TEXT) < 400
    assert {"type": "decision", "content": "Keep the standard library only."} in record[
        "memory_written"
    ]
    diff = record["diff"]
    assert diff["removed_total"] + diff["kept"] == record["messages_before"]
    assert diff["added_total"] + diff["kept"] == record["messages_after"]
    assert diff["removed_total"] > diff["added_total"]
    # The system prompt went on unchanged: the diff starts after it, on both sides.
    assert diff["removed"][0]["index"] == diff["added"][0]["index"] == 1
    assert "summary of earlier conversation" in diff["added"][0]["preview"]
    assert diff["added"][0]["chars"] > len(diff["added"][0]["preview"])
    assert [item["index"] for item in diff["removed"][:3]] == [1, 2, 3]

    quiet_found = await get_json(client, proxy, "sessions/quiet")
    (quiet_entry,) = quiet_found["timeline"]
    assert quiet_entry["status"] == "none" and quiet_found["records"] == []
    assert quiet_entry["bytes_after"] == quiet_entry["bytes_before"]

    memory = await get_json(client, proxy, "sessions/agent-1/memory")
    written = (tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl").read_text()
    assert memory["text"] == written and memory["size"] == len(written.encode())
    assert (await get_json(client, proxy, "sessions/quiet/memory"))["size"] == 0
    await get_json(client, proxy, "sessions/nobody", status=404)
    await get_json(client, proxy, "sessions/.hidden", status=400)


async def test_the_sessions_page_is_sorted_filtered_and_paged_by_the_proxy(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    for i in range(5):
        await post(client, proxy, conversation_of(100 + i), session=f"agent-{i}")
    first = await get_json(client, proxy, "sessions?sort=session_id&order=asc&limit=2")
    assert [s["session_id"] for s in first["sessions"]] == ["agent-0", "agent-1"]
    assert first["total"] == 5 and first["offset"] == 0 and first["limit"] == 2
    last = await get_json(client, proxy, "sessions?sort=session_id&order=asc&limit=2&offset=4")
    assert [s["session_id"] for s in last["sessions"]] == ["agent-4"]
    newest = await get_json(client, proxy, "sessions?limit=1")
    assert newest["sessions"][0]["session_id"] == "agent-4"
    only = await get_json(client, proxy, "sessions?q=AGENT-3")
    assert [s["session_id"] for s in only["sessions"]] == ["agent-3"]
    by_dialect = await get_json(client, proxy, "sessions?q=chat")
    assert by_dialect["total"] == 5
    for bad in ("sort=password", "limit=0", "limit=100000", "offset=-1", "limit=x"):
        error = await get_json(client, proxy, f"sessions?{bad}", status=400)
        assert error["error"]["code"] == "invalid_request"


async def test_live_figures_count_requests_but_not_the_dashboards_own(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start()
    before = await get_json(client, proxy, "live")
    for i in range(3):
        await post(client, proxy, conversation_of(100), session=f"s{i}")
    after = await get_json(client, proxy, "live")
    assert after["requests"] - before["requests"] == 3
    assert after["time"] > before["time"]
    assert after["upstream_latency_ms"]["p50"] is not None
    assert after["upstream_latency_ms"]["p99"] >= after["upstream_latency_ms"]["p50"]
    assert after["overhead_ms"]["p99"] >= after["overhead_ms"]["p50"] >= 0
    assert after["state"]["healthy"] is True
    assert after["in_flight"] == 0 and after["compactions"] == 0
    assert after["background_tasks"] == 0


def test_quantiles_are_read_from_cumulative_buckets_as_prometheus_does() -> None:
    buckets = {0.1: 50.0, 0.2: 90.0, 0.4: 100.0, float("inf"): 100.0}
    assert quantile_of_buckets(buckets, 0.5) == pytest.approx(0.1)
    assert quantile_of_buckets(buckets, 0.7) == pytest.approx(0.15)
    assert quantile_of_buckets(buckets, 0.99) == pytest.approx(0.38)
    assert quantile_of_buckets({0.1: 0.0, float("inf"): 0.0}, 0.5) is None
    assert quantile_of_buckets({0.1: 1.0, float("inf"): 3.0}, 0.99) == pytest.approx(0.1)


async def test_receipts_keep_conversation_text_out_when_previews_are_off(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start(admin={"preview_chars": 0})
    await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    (record,) = (await get_json(client, proxy, "sessions/agent-1"))["records"]
    assert record["summary"] == "" and record["summary_preview"] == ""
    assert record["memory_written"] and all(i["content"] == "" for i in record["memory_written"])
    diff = record["diff"]
    assert diff["removed"] and all(i["preview"] == "" and i["chars"] > 0 for i in diff["removed"])


async def test_standing_instructions_without_room_are_counted_in_record_session_and_metric(
    start: Any, script: Script, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    proxy = await start(compaction={"pinned_ratio": 0.02})
    rules = [f"Never rename the table orders_{i} without a migration note." for i in range(12)]
    said: list[dict[str, Any]] = [{"role": "system", "content": "You are a database assistant."}]
    for rule in rules:
        said += [{"role": "user", "content": rule}, {"role": "assistant", "content": "Noted."}]
    await post(client, proxy, conversation_of(int(WINDOW * 1.2), grow=[*said, said[-1]]))
    found = await get_json(client, proxy, "sessions/agent-1")
    (record,) = found["records"]
    assert record["path"] == "llm" and record["pinned_overflow"] > 0
    assert found["pinned_overflow"] == record["pinned_overflow"]
    page = await get_json(client, proxy, "sessions")
    assert page["sessions"][0]["pinned_overflow"] == record["pinned_overflow"]
    assert f"- ({record['pinned_overflow']} more had no room here" in record["summary"]
    written = (tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl").read_text()
    assert sum(rule in written for rule in rules) >= record["pinned_overflow"]
    async with client.get(f"{proxy.url}/metrics") as response:
        metrics = await response.text()
    assert f"compaction_proxy_pinned_overflow_total {float(record['pinned_overflow'])}" in metrics
