// The limiter's admin page. Plain JavaScript, no build step, no third-party
// code. The token lives in this tab's sessionStorage and travels only as an
// Authorization header (no cookies: nothing for a cross-site request to
// ride on). Every string from the server is put in the page with
// textContent, never as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "limiter.admin.token";
  // The recent actions are the calls that changed something (releases) and
  // the refused ones. Reads are audited too, this page's own among them,
  // but would crowd those out: more records are fetched than shown, so a
  // run of reads does not empty the list.
  const AUDIT_PATH = "/v1/admin/audit?limit=200";
  const AUDIT_SHOWN = 50;
  // The API is served beside the page: /admin/ → /v1/admin/..., also
  // behind a proxy that adds a path prefix.
  const base = location.pathname.replace(/admin\/[^/]*$/, "");

  const $ = (id) => document.getElementById(id);
  let role = "";
  let signedIn = false;
  let shown = null; // {user, slots, used, override, fetchedAt}
  let ticker = 0;

  class APIError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch(base + path.replace(/^\//, ""), {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        credentials: "omit",
      });
    } catch (e) {
      throw new APIError(0, "network", "The limiter did not answer: " + e.message);
    }
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    if (!resp.ok) {
      const err = (data && data.error) || {};
      if (resp.status === 401 && signedIn) {
        signOut("Your token is no longer accepted. Sign in again.");
      }
      throw new APIError(resp.status, err.code || "http_" + resp.status, err.message || resp.statusText);
    }
    return { data, role: resp.headers.get("X-Admin-Role") || "" };
  }

  function show(el, visible) {
    el.hidden = !visible;
  }

  function setError(el, err) {
    el.textContent = err ? err.message + (err.code && err.status ? " (" + err.status + " " + err.code + ")" : "") : "";
    show(el, !!err);
  }

  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function formatTime(iso) {
    const d = new Date(iso);
    if (isNaN(d)) return iso;
    const pad = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  // formatClock shows whole seconds as [d day(s) ]h:mm:ss, or m:ss under
  // an hour.
  function formatClock(total) {
    const d = Math.floor(total / 86400);
    const h = Math.floor((total % 86400) / 3600);
    const m = Math.floor((total % 3600) / 60);
    const s = total % 60;
    const pad = (n) => String(n).padStart(2, "0");
    const clock = (d > 0 || h > 0 ? h + ":" + pad(m) : String(m)) + ":" + pad(s);
    return d > 0 ? d + (d === 1 ? " day " : " days ") + clock : clock;
  }

  function formatLeft(ms) {
    if (ms <= 0) return "expired";
    return formatClock(Math.ceil(ms / 1000));
  }

  function formatAge(ms) {
    return formatClock(Math.max(0, Math.floor(ms / 1000)));
  }

  // --- sign in / out ---

  async function signIn(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    try {
      const res = await api("GET", AUDIT_PATH);
      role = res.role;
      enter();
      renderAudit(res.data.records);
      return null;
    } catch (err) {
      sessionStorage.removeItem(TOKEN_KEY);
      return err;
    }
  }

  function enter() {
    signedIn = true;
    $("role").textContent = role || "unknown";
    show($("who"), true);
    show($("signin"), false);
    show($("app"), true);
    $("user").focus();
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    signedIn = false;
    role = "";
    hideSlots();
    show($("who"), false);
    show($("app"), false);
    show($("signin"), true);
    $("token").value = "";
    setError($("signin-error"), message ? { message } : null);
  }

  // --- slots ---

  // userPath is the API path of one user's resource. A browser resolves a
  // "." or ".." segment as "this" or "parent" directory even when written
  // %2E (the URL standard decodes it first), so the page cannot ask about
  // those two ids: it says so instead of calling another route.
  function userPath(user, resource) {
    if (user === "." || user === "..") {
      throw new APIError(0, "", 'A browser cannot send the user id "' + user + '": it reads it as a path step. ' +
        "Use the CLI instead: limiter admin slots " + user);
    }
    return "/v1/admin/users/" + encodeURIComponent(user) + "/" + resource;
  }

  async function lookUp(user) {
    setError($("lookup-error"), null);
    try {
      const res = await api("GET", userPath(user, "slots"));
      role = res.role || role;
      shown = {
        user: res.data.user_id, slots: res.data.slots, used: res.data.used,
        queue: res.data.queue || [], override: res.data.override || null, fetchedAt: performance.now(),
      };
      renderSlots();
    } catch (err) {
      // No card of the user shown before: its "Release all slots" would
      // act on them, not on the user just asked about.
      hideSlots();
      setError($("lookup-error"), err);
    }
    refreshAudit();
  }

  function hideSlots() {
    shown = null;
    clearInterval(ticker);
    show($("slots-card"), false);
    for (const id of ["confirm", "override-dialog", "remove-dialog"]) {
      if ($(id).open) $(id).close();
    }
  }

  function renderSlots() {
    $("slots-user").textContent = shown.user;
    $("used").textContent = String(shown.used);
    $("used-label").textContent = shown.used === 1 ? "live slot" : "live slots";
    const body = $("slots").tBodies[0];
    body.replaceChildren();
    for (const s of shown.slots) {
      const tr = document.createElement("tr");
      tr.dataset.stream = s.stream_id;
      const left = cell("", "ttl");
      left.title = "expires at " + formatTime(s.expires_at);
      const age = cell(s.age_ms === undefined ? "—" : "", "age");
      if (s.started_at) age.title = "since " + formatTime(s.started_at);
      tr.append(cell(s.stream_id, "mono"), cell(s.caller || "—", "nowrap"), cell(s.label || "—", "mono label"),
        cell(s.plan || "—", "nowrap"), age, left);
      body.append(tr);
    }
    show($("slots"), shown.slots.length > 0);
    show($("no-slots"), shown.slots.length === 0);
    const queue = $("queue").tBodies[0];
    queue.replaceChildren();
    for (const q of shown.queue) {
      const tr = document.createElement("tr");
      tr.dataset.stream = q.stream_id;
      tr.append(cell(String(q.place)), cell(q.stream_id, "mono"), cell(formatTime(q.waiting_since)), cell(""));
      queue.append(tr);
    }
    show($("queue"), shown.queue.length > 0);
    show($("no-queue"), shown.queue.length === 0);
    const operator = role === "operator";
    $("release").disabled = !operator || shown.slots.length === 0;
    $("set-override").disabled = !operator;
    $("remove-override").disabled = !operator;
    show($("release-note"), !operator);
    renderOverride();
    show($("slots-card"), true);
    tick();
    clearInterval(ticker);
    ticker = setInterval(tick, 250);
  }

  function renderOverride() {
    const o = shown.override;
    show($("override"), !!o);
    if (!o) return;
    $("override-limit").textContent = o.max_concurrent_streams + (o.max_concurrent_streams === 1 ? " stream" : " streams");
    $("override-until").textContent = formatTime(o.expires_at);
    $("override-actor").textContent = o.actor || "—";
    $("override-reason").textContent = o.reason;
  }

  // tick updates the countdowns and ages from the times Redis reported, so
  // they do not depend on this machine's clock agreeing with Redis's.
  function tick() {
    if (!shown) return;
    const elapsed = performance.now() - shown.fetchedAt;
    const rows = $("slots").tBodies[0].rows;
    shown.slots.forEach((s, i) => {
      const row = rows[i];
      if (!row) return;
      const left = s.ttl_ms - elapsed;
      row.cells[5].textContent = formatLeft(left);
      row.cells[5].classList.toggle("expired", left <= 0);
      if (s.age_ms !== undefined) row.cells[4].textContent = formatAge(s.age_ms + elapsed);
    });
    // And how long each waiting acquire has waited, from what Redis
    // reported, counting on.
    const qrows = $("queue").tBodies[0].rows;
    shown.queue.forEach((q, i) => {
      const td = qrows[i] && qrows[i].cells[3];
      if (td) td.textContent = formatLeft(q.waited_ms + elapsed);
    });
    if (shown.override) {
      const left = shown.override.ttl_ms - elapsed;
      $("override-left").textContent = formatLeft(left);
      $("override-left").classList.toggle("expired", left <= 0);
    }
  }

  // --- release ---

  function openConfirm() {
    if (!shown) return;
    $("confirm-user").textContent = shown.user;
    $("confirm-count").textContent = String(shown.slots.length);
    $("reason").value = "";
    updateReason();
    setError($("confirm-error"), null);
    $("confirm").showModal();
    $("reason").focus();
  }

  function updateReason() {
    const reason = $("reason").value.trim();
    $("reason-count").textContent = String($("reason").value.length);
    $("confirm-release").disabled = reason.length === 0;
  }

  async function release() {
    const reason = $("reason").value.trim();
    if (!reason || !shown) return;
    const user = shown.user;
    const waiting = shown.queue.length > 0;
    $("confirm-release").disabled = true;
    try {
      const res = await api("POST", userPath(user, "release"), { reason });
      $("confirm").close();
      const ids = res.data.released;
      note("Released " + ids.length + (ids.length === 1 ? " slot" : " slots") + " of " + user +
        (ids.length ? ": " + ids.join(", ") : "") + " · audit id " + res.data.audit_id);
      await lookUp(user);
      // The waiting acquires take the released slots a moment after the
      // release answered: look again to show them served.
      if (waiting) setTimeout(() => { if (shown && shown.user === user) lookUp(user); }, 500);
    } catch (err) {
      setError($("confirm-error"), err);
      updateReason();
    }
  }

  // --- override ---

  function openOverride() {
    if (!shown) return;
    $("override-user").textContent = shown.user;
    $("override-why").value = "";
    updateOverride();
    setError($("override-error"), null);
    $("override-dialog").showModal();
    $("override-streams").focus();
  }

  function updateOverride() {
    const ok = $("override-why").value.trim().length > 0 && $("override-streams").value !== "" && $("override-for").value !== "";
    $("confirm-override").disabled = !ok;
  }

  async function setOverride() {
    if (!shown) return;
    const user = shown.user;
    const body = {
      max_concurrent_streams: Number($("override-streams").value),
      expires_in: Number($("override-for").value) * Number($("override-unit").value),
      reason: $("override-why").value.trim(),
    };
    $("confirm-override").disabled = true;
    try {
      const res = await api("POST", userPath(user, "override"), body);
      $("override-dialog").close();
      const o = res.data.override;
      note("Override set for " + user + ": " + o.max_concurrent_streams + (o.max_concurrent_streams === 1 ? " stream" : " streams") +
        " until " + formatTime(o.expires_at) + " · audit id " + res.data.audit_id);
      await lookUp(user);
    } catch (err) {
      setError($("override-error"), err);
      updateOverride();
    }
  }

  function openRemove() {
    if (!shown) return;
    $("remove-user").textContent = shown.user;
    $("remove-why").value = "";
    $("confirm-remove").disabled = true;
    setError($("remove-error"), null);
    $("remove-dialog").showModal();
    $("remove-why").focus();
  }

  async function removeOverride() {
    const reason = $("remove-why").value.trim();
    if (!reason || !shown) return;
    const user = shown.user;
    $("confirm-remove").disabled = true;
    try {
      const res = await api("DELETE", userPath(user, "override"), { reason });
      $("remove-dialog").close();
      note((res.data.removed ? "Removed the override of " + user : user + " had no override in force") + " · audit id " + res.data.audit_id);
      await lookUp(user);
    } catch (err) {
      setError($("remove-error"), err);
      $("confirm-remove").disabled = false;
    }
  }

  function note(text) {
    const notice = $("notice");
    notice.textContent = text;
    show(notice, true);
  }

  // --- audit ---

  const changes = ["release_all", "set_override", "remove_override"];

  function worthShowing(r) {
    return changes.includes(r.action) || r.outcome !== "ok";
  }

  async function refreshAudit() {
    try {
      const res = await api("GET", AUDIT_PATH);
      setError($("audit-error"), null);
      renderAudit(res.data.records);
    } catch (err) {
      setError($("audit-error"), err);
    }
  }

  // result shows what a call changed: how many slots a release freed (the
  // ids are in its tooltip), the override set, or whether one was removed.
  function result(r) {
    if (r.released) {
      const td = cell(r.released.length + (r.released.length === 1 ? " slot" : " slots"), "nowrap");
      td.title = r.released.join("\n");
      return td;
    }
    if (r.override) {
      const n = r.override.max_concurrent_streams;
      return cell(n + (n === 1 ? " stream" : " streams") + " until " + formatTime(r.override.expires_at), "wrap");
    }
    if (r.override_removed !== undefined) return cell(r.override_removed ? "removed" : "none in force", "nowrap");
    return cell("");
  }

  const actionNames = {
    list_slots: "list slots", release_all: "release all", read_audit: "read audit",
    set_override: "set override", remove_override: "remove override",
  };

  function renderAudit(records) {
    const body = $("audit").tBodies[0];
    body.replaceChildren();
    for (const r of records.filter(worthShowing).slice(0, AUDIT_SHOWN)) {
      const tr = document.createElement("tr");
      tr.dataset.auditId = r.audit_id;
      const outcome = document.createElement("span");
      outcome.className = "badge " + (r.outcome === "ok" ? "ok" : "refused");
      outcome.textContent = r.outcome === "ok" ? "ok" : r.status + " " + r.outcome;
      if (r.detail) outcome.title = r.detail;
      const outcomeCell = cell("");
      outcomeCell.append(outcome);
      tr.append(
        cell(formatTime(r.time), "nowrap"),
        cell(r.actor ? r.actor + " (" + r.role + ")" : "—", "nowrap"),
        cell(actionNames[r.action] || r.action, "nowrap"),
        cell(r.user_id || "—", "mono wrap"),
        outcomeCell,
        result(r),
        cell(r.reason || "", "wrap"),
        cell(r.audit_id, "mono"),
      );
      body.append(tr);
    }
  }

  // --- wiring ---

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const token = $("token").value.trim();
      if (!token) return;
      $("sign-in").disabled = true;
      const err = await signIn(token);
      $("sign-in").disabled = false;
      setError($("signin-error"), err && err.status === 401 ? { message: "That token is not accepted." } : err);
    });
    $("sign-out").addEventListener("click", () => signOut(""));
    $("lookup-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const user = $("user").value.trim();
      show($("notice"), false);
      if (user) lookUp(user);
    });
    $("refresh-slots").addEventListener("click", () => shown && lookUp(shown.user));
    $("refresh-audit").addEventListener("click", refreshAudit);
    $("release").addEventListener("click", openConfirm);
    $("reason").addEventListener("input", updateReason);
    $("cancel-release").addEventListener("click", () => $("confirm").close());
    $("confirm-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      release();
    });
    $("set-override").addEventListener("click", openOverride);
    for (const id of ["override-streams", "override-for", "override-why"]) {
      $(id).addEventListener("input", updateOverride);
    }
    $("cancel-override").addEventListener("click", () => $("override-dialog").close());
    $("override-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      setOverride();
    });
    $("remove-override").addEventListener("click", openRemove);
    $("remove-why").addEventListener("input", () => {
      $("confirm-remove").disabled = $("remove-why").value.trim().length === 0;
    });
    $("cancel-remove").addEventListener("click", () => $("remove-dialog").close());
    $("remove-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      removeOverride();
    });

    if (sessionStorage.getItem(TOKEN_KEY)) {
      signIn(sessionStorage.getItem(TOKEN_KEY)).then((err) => {
        if (err) signOut(err.status === 401 ? "Your token is no longer accepted. Sign in again." : err.message);
      });
    } else {
      signOut("");
    }
  });
})();
