// The dashboard's script: asks for admin.token once per tab (kept in sessionStorage, sent as a
// Bearer header, never in a URL), then renders the views from /admin/api/. Every value from
// the API goes into the page as text (textContent), never as markup.
"use strict";

const TOKEN_KEY = "compaction-proxy.admin-token";
const LIVE_EVERY_MS = 2000;
const PAGE_SIZE = 50;
// A call that has not answered by then is given up and the view tries again: a request stuck on
// a dead connection (or a replica behind a balancer that stopped answering) never leaves the
// page empty.
const CALL_TIMEOUT_MS = 4000;
const RETRY_MS = [500, 1000, 2000, 4000];
const state = { sort: "last_seen", order: "desc", q: "", offset: 0, lastLive: null, timer: null, shown: 0 };

const $ = (selector) => document.querySelector(selector);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "dataset") Object.assign(node.dataset, value);
    else if (name === "className") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const number = (value) => (value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US"));
const money = (value) => (value === null || value === undefined ? "–" : "$" + Number(value).toFixed(4));
const pair = (figures) => `${number(figures.p50)} / ${number(figures.p99)}`;

class Refused extends Error {}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch("api/" + path, {
    headers: { Authorization: "Bearer " + token },
    cache: "no-store",
    signal: AbortSignal.timeout(CALL_TIMEOUT_MS),
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("The token was refused (401).");
    throw new Refused();
  }
  let payload = null;
  try {
    payload = await response.json();
  } catch (error) {
    // Not ours (a balancer's error page): its status says enough.
  }
  if (!response.ok) throw new Error(payload && payload.error ? payload.error.message : `${response.status} ${response.statusText}`);
  return payload;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function show(view) {
  for (const id of ["login-view", "sessions-view", "session-view"]) $("#" + id).hidden = id !== view;
  const in_ = view !== "login-view";
  $("#live").hidden = !in_;
  $("#logout").hidden = !in_;
}

function showLogin(message) {
  clearInterval(state.timer);
  state.timer = null;
  show("login-view");
  const error = $("#login-error");
  error.textContent = message || "";
  error.hidden = !message;
}

// The view's own first call says whether the token is right (a 401 shows the form again): the
// sessions come in one round trip, not behind a check of their own.
function login(event) {
  event.preventDefault();
  const input = $("#token");
  sessionStorage.setItem(TOKEN_KEY, input.value);
  input.value = "";
  $("#login-error").hidden = true;
  route();
}

// -- live figures ---------------------------------------------------------------------------

async function refreshLive() {
  let live;
  try {
    live = await api("live");
  } catch (error) {
    return;
  }
  const last = state.lastLive;
  if (last && live.time > last.time) {
    $("#live-rps").textContent = ((live.requests - last.requests) / (live.time - last.time)).toFixed(1);
  }
  state.lastLive = live;
  $("#live-requests").textContent = number(live.requests);
  $("#live-in-flight").textContent = number(live.in_flight);
  $("#live-overhead").textContent = pair(live.overhead_ms);
  $("#live-latency").textContent = pair(live.upstream_latency_ms);
  $("#live-lag").textContent = pair(live.loop_lag_ms);
  $("#live-queue").textContent = number(live.background_tasks);
  $("#live-compactions").textContent = `${number(live.compactions)} / ${number(live.summarizer_failures)}`;
  const health = $("#live-state");
  health.textContent = live.state.healthy ? "healthy" : `degraded (${number(live.state.errors)} errors)`;
  health.className = live.state.healthy ? "status-applied" : "status-failed";
}

function startLive() {
  if (state.timer === null) {
    refreshLive();
    state.timer = setInterval(refreshLive, LIVE_EVERY_MS);
  }
}

// -- sessions -------------------------------------------------------------------------------

// The page of sessions the controls ask for. A call that fails or hangs is said and tried again
// (less and less often) while that page is still the one asked for; an answer to a page asked for
// before another is dropped.
async function renderSessions() {
  show("sessions-view");
  const params = new URLSearchParams({
    sort: state.sort, order: state.order, q: state.q, offset: state.offset, limit: PAGE_SIZE,
  });
  const asked = ++state.shown;
  const info = $("#page-info");
  if (!$("#sessions-table tbody").children.length) info.textContent = "Loading sessions…";
  let page = null;
  for (let attempt = 0; page === null; attempt++) {
    try {
      page = await api("sessions?" + params);
    } catch (error) {
      if (error instanceof Refused) throw error;
      if (asked !== state.shown) return;
      info.textContent = `Sessions not loaded (${error.message || error.name}), trying again…`;
      info.className = "error";
      await sleep(RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)]);
      if (asked !== state.shown || $("#sessions-view").hidden) return;
    }
  }
  if (asked !== state.shown) return;
  info.className = "";
  const rows = page.sessions.map((s) =>
    el("tr", { dataset: { session: s.session_id } },
      el("td", {}, el("a", { href: "#/session/" + encodeURIComponent(s.session_id) }, s.session_id)),
      el("td", {}, s.dialect || "–"),
      el("td", {}, s.model || "–"),
      el("td", { className: "num" }, number(s.requests)),
      el("td", { className: "num" }, number(s.records_total)),
      el("td", { className: "num" }, number(s.tokens_sent)),
      el("td", { className: "num" }, number(s.tokens_forwarded)),
      el("td", { className: "num", dataset: { field: "tokens_saved" } }, number(s.tokens_saved)),
      el("td", { className: "num", title: "at the cached-input price: " + money(s.money_saved_cached) }, money(s.money_saved)),
      el("td", { className: "num" }, number(s.summarizer_calls)),
      el("td", { className: "num" }, number(s.summarizer_failures)),
      el("td", {}, s.last_seen),
    ));
  $("#sessions-table tbody").replaceChildren(...rows);
  const end = Math.min(page.offset + page.sessions.length, page.total);
  $("#page-info").textContent = page.total ? `${page.offset + 1}–${end} of ${page.total}` : "no sessions";
  $("#prev").disabled = page.offset === 0;
  $("#next").disabled = end >= page.total;
  for (const th of document.querySelectorAll("#sessions-table th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === state.sort);
    th.classList.toggle("asc", th.dataset.sort === state.sort && state.order === "asc");
  }
}

// -- one session ----------------------------------------------------------------------------

function tokenBar(entry, window, trigger) {
  const scale = (tokens) => `${Math.min(100, (100 * tokens) / window).toFixed(1)}%`;
  const bar = el("div", { className: "bar", title: `window ${window}, trigger ${trigger}` });
  if (entry.tokens_before !== null) {
    const sent = el("span", { className: "sent" });
    sent.style.width = scale(entry.tokens_before);
    const forwarded = el("span", { className: "forwarded" });
    forwarded.style.width = scale(entry.tokens_after);
    bar.append(sent, forwarded);
  }
  const mark = el("span", { className: "trigger" });
  mark.style.left = scale(trigger);
  bar.append(mark);
  return bar;
}

function diffList(className, items, total) {
  const list = el("ol", { className });
  for (const item of items) {
    list.append(el("li", { value: item.index + 1 }, el("b", {}, item.role), ` (${number(item.chars)} chars) `, item.preview));
  }
  const shown = el("div", {}, list);
  if (total > items.length) shown.append(el("p", {}, `${total - items.length} more not shown`));
  return shown;
}

function receipt(record) {
  const diff = record.diff || { removed: [], added: [], removed_total: 0, added_total: 0, kept: 0 };
  const grade = record.quality === null || record.quality === undefined ? "–" : record.quality;
  const memory = el("ul", { className: "memory-items" },
    ...(record.memory_written || []).map((item) => el("li", {}, el("b", {}, item.type), " ", item.content)));
  return el("article", { className: "receipt", dataset: { compaction: record.id } },
    el("h4", {}, `${record.time} · ${record.reason} · path ${record.path}` + (record.mode === "shadow" ? " · shadow: computed, not forwarded" : "")),
    el("dl", { className: "figures" },
      el("div", {}, el("dt", {}, "tokens"), el("dd", { className: "receipt-tokens" }, `${number(record.tokens_before)} → ${number(record.tokens_after)}`)),
      el("div", {}, el("dt", {}, "messages"), el("dd", {}, `${number(record.messages_before)} → ${number(record.messages_after)}`)),
      el("div", {}, el("dt", {}, "folded"), el("dd", { className: "receipt-folded" }, `${number(record.folded_messages)} messages` + (record.folded_range ? ` [${record.folded_range[0]}, ${record.folded_range[1]})` : ""))),
      el("div", {}, el("dt", {}, "verification"), el("dd", { className: "receipt-grade" }, `${grade} (${number(record.key_decisions_preserved)} / ${number(record.key_decisions_total)} decisions)`)),
      el("div", {}, el("dt", {}, "memory items"), el("dd", {}, number(record.memory_items))),
      el("div", {}, el("dt", {}, "standing instructions without room"), el("dd", { className: "receipt-pinned-overflow" }, number(record.pinned_overflow))),
      el("div", {}, el("dt", {}, "took (ms)"), el("dd", {}, number(record.duration_ms))),
    ),
    record.errors && record.errors.length ? el("p", { className: "error" }, "summarizer: " + record.errors.join("; ")) : null,
    el("h5", {}, "Summary as sent"),
    el("pre", { className: "summary" }, record.summary || record.summary_preview || ""),
    el("h5", {}, "Memory items written"),
    memory,
    el("h5", {}, `Diff: ${number(diff.removed_total)} messages as sent → ${number(diff.added_total)} as forwarded, ${number(diff.kept)} kept unchanged`),
    el("div", { className: "diff" },
      diffList("diff-removed", diff.removed, diff.removed_total),
      diffList("diff-added", diff.added, diff.added_total)),
  );
}

// The session view emptied, saying `message`: nothing of the session shown before stays on
// screen under another route.
function clearSession(message, className = "") {
  show("session-view");
  $("#session-name").textContent = "";
  for (const selector of ["#session-summary", "#timeline tbody"]) $(selector).replaceChildren();
  $("#receipts").replaceChildren(el("p", { className }, message));
  $("#memory").textContent = "";
}

async function renderSession(sessionId) {
  clearSession("Loading…");
  const path = "sessions/" + encodeURIComponent(sessionId);
  const [found, memory] = await Promise.all([api(path), api(path + "/memory")]);
  $("#session-name").textContent = found.session_id;
  const facts = [
    ["dialect", found.dialect || "–"], ["model", found.model || "–"],
    ["requests", number(found.requests)], ["compactions", number(found.records_total)],
    ["tokens sent", number(found.tokens_sent)], ["tokens forwarded", number(found.tokens_forwarded)],
    ["tokens saved", number(found.tokens_saved)], ["money saved", money(found.money_saved)],
    ["window / trigger", `${number(found.window)} / ${number(found.trigger)}`],
    ["summarizer calls / failures", `${number(found.summarizer_calls)} / ${number(found.summarizer_failures)}`],
    ["standing instructions in memory only", number(found.pinned_overflow)],
    ["last activity", found.last_seen],
  ];
  $("#session-summary").replaceChildren(...facts.map(([name, value]) => el("div", {}, el("dt", {}, name), el("dd", {}, value))));
  $("#timeline tbody").replaceChildren(...found.timeline.map((entry) =>
    el("tr", { dataset: { status: entry.status } },
      el("td", {}, entry.time),
      el("td", {}, entry.dialect),
      el("td", { className: "status-" + entry.status }, entry.status),
      el("td", { className: "num" }, entry.tokens_before === null ? `~${number(entry.bytes_before)} bytes` : number(entry.tokens_before)),
      el("td", { className: "num" }, entry.tokens_after === null ? `~${number(entry.bytes_after)} bytes` : number(entry.tokens_after)),
      el("td", {}, tokenBar(entry, found.window, found.trigger)),
      el("td", { className: "num" }, entry.upstream_status),
      el("td", { className: "num" }, number(entry.overhead_ms)),
    )));
  const records = [...found.records].reverse();
  $("#receipts").replaceChildren(...(records.length ? records.map(receipt) : [el("p", {}, "No compaction yet.")]));
  $("#memory").textContent = memory.size ? memory.text : "(no memory file yet)";
}

// -- routing --------------------------------------------------------------------------------

async function route() {
  if (!sessionStorage.getItem(TOKEN_KEY)) {
    showLogin("");
    return;
  }
  const match = location.hash.match(/^#\/session\/(.+)$/);
  try {
    if (match) await renderSession(decodeURIComponent(match[1]));
    else await renderSessions();
  } catch (error) {
    if (error instanceof Refused) return;
    console.error(error);
    if (match) clearSession(`No session to show: ${error.message}`, "error");
  }
  // After the view: its call is the first the proxy answers.
  if (sessionStorage.getItem(TOKEN_KEY)) startLive();
}

function wire() {
  $("#login").addEventListener("submit", login);
  $("#logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  for (const th of document.querySelectorAll("#sessions-table th[data-sort]")) {
    th.addEventListener("click", () => {
      state.order = state.sort === th.dataset.sort && state.order === "desc" ? "asc" : "desc";
      state.sort = th.dataset.sort;
      state.offset = 0;
      renderSessions().catch(() => {});
    });
  }
  let typing = null;
  $("#filter").addEventListener("input", (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.q = event.target.value;
      state.offset = 0;
      renderSessions().catch(() => {});
    }, 250);
  });
  $("#prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - PAGE_SIZE);
    renderSessions().catch(() => {});
  });
  $("#next").addEventListener("click", () => {
    state.offset += PAGE_SIZE;
    renderSessions().catch(() => {});
  });
  $("#sessions-table tbody").addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-session]");
    if (row && event.target.tagName !== "A") location.hash = "#/session/" + encodeURIComponent(row.dataset.session);
  });
  window.addEventListener("hashchange", route);
  route();
}

wire();
