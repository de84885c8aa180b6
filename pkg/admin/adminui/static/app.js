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
  let shown = null; // {user, slots, used, queue, override, planLimits, fetchedAt}
  let shownPool = null; // {pool, key, slots (its holders), waiters, used, limit, enforce, override, deleted, fetchedAt}
  let target = null; // what the override dialogs act on (userTarget, poolTarget)
  let releasing = null; // what the release dialog acts on: {user, waiting}, fixed when it opens
  // Answers can arrive out of order (a slow look-up's after a later one's):
  // each look-up takes the next number, and only the latest one's answer
  // is shown.
  let userLookups = 0;
  let poolLookups = 0;
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

  // formatTime shows a time in UTC, as the limiter's logs and the CLI do,
  // saying so: support compares it with those, not with its own clock.
  function formatTime(iso) {
    const d = new Date(iso);
    if (isNaN(d)) return iso;
    const pad = (n) => String(n).padStart(2, "0");
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
  }

  // localTime is the same time in the browser's zone, named, for a
  // tooltip.
  function localTime(iso) {
    const d = new Date(iso);
    if (isNaN(d)) return "";
    return d.toLocaleString(undefined, { timeZoneName: "short" }) + " (your browser's time zone)";
  }

  // timeCell is a cell showing iso in UTC, the browser's time in its
  // tooltip.
  function timeCell(iso, cls) {
    const td = cell(formatTime(iso), cls);
    td.title = localTime(iso);
    return td;
  }

  // NO_CALLER explains a Caller cell with none: an open slot API (no
  // api.tokensFile) does not know who calls.
  const NO_CALLER = "No caller recorded: the slot API was open (no api.tokensFile), so the limiter did not know who called.";

  function callerCell(caller) {
    const td = cell(caller || "—", "nowrap");
    if (!caller) {
      td.title = NO_CALLER;
      td.classList.add("no-caller");
    }
    return td;
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
    clearInterval(ticker);
    ticker = setInterval(tick, 250);
    $("role").textContent = role || "unknown";
    show($("who"), true);
    show($("signin"), false);
    show($("app"), true);
    $("user").focus();
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    signedIn = false;
    // Answers to look-ups still on their way are not shown.
    userLookups++;
    poolLookups++;
    role = "";
    clearInterval(ticker);
    hideSlots();
    hidePool();
    show($("who"), false);
    show($("app"), false);
    show($("signin"), true);
    $("token").value = "";
    setError($("signin-error"), message ? { message } : null);
  }

  // --- slots ---

  // segment escapes value, what the page names it, as one path segment (a
  // "/" in a pool key is %2F). A browser resolves a "." or ".." segment as
  // "this" or "parent" directory even when written %2E (the URL standard
  // decodes it first), so the page cannot ask about those two: it says so,
  // naming the CLI command that can, instead of calling another route.
  function segment(value, what, cli) {
    if (value === "." || value === "..") {
      throw new APIError(0, "", "A browser cannot send the " + what + ' "' + value + '": it reads it as a path step. ' +
        "Use the CLI instead: " + cli);
    }
    return encodeURIComponent(value);
  }

  // userPath is the API path of one user's resource.
  function userPath(user, resource) {
    return "/v1/admin/users/" + segment(user, "user id", "limiter admin slots " + user) + "/" + resource;
  }

  // poolPath is the API path of one pool key, or of its resource.
  function poolPath(pool, key, resource) {
    const cli = "limiter admin pool " + pool + " " + key;
    return "/v1/admin/pools/" + segment(pool, "pool", cli) + "/keys/" + segment(key, "pool key", cli) + (resource ? "/" + resource : "");
  }

  async function lookUp(user) {
    const lookup = ++userLookups;
    setError($("lookup-error"), null);
    try {
      const res = await api("GET", userPath(user, "slots"));
      if (lookup !== userLookups) return; // a later look-up's answer is the one to show
      role = res.role || role;
      if (shown && shown.user !== res.data.user_id) leaveCard("user", shown.user, res.data.user_id);
      shown = {
        user: res.data.user_id, slots: res.data.slots, used: res.data.used,
        queue: res.data.queue || [], override: res.data.override || null, planLimits: res.data.plan_limits || [],
        fetchedAt: performance.now(),
      };
      renderSlots();
    } catch (err) {
      if (lookup !== userLookups) return;
      // No card of the user shown before: its "Release all slots" would
      // act on them, not on the user just asked about.
      hideSlots();
      setError($("lookup-error"), err);
    }
    refreshAudit();
  }

  function hideSlots() {
    shown = null;
    show($("slots-card"), false);
    closeDialogs("user");
  }

  // closeDialogs closes the dialogs open on the card of kind ("user":
  // release and overrides, "pool": overrides): what they name is no longer
  // shown. It reports whether one was open.
  function closeDialogs(kind) {
    const open = ["override-dialog", "remove-dialog"].filter((id) => target && target.kind === kind && $(id).open);
    if (kind === "user" && $("confirm").open) open.push("confirm");
    for (const id of open) $(id).close();
    return open.length > 0;
  }

  // leaveCard closes the dialogs opened on the card of kind when it comes
  // to show next instead of was: each names what it acts on, and the card
  // behind it would name another. The notice says why the dialog went.
  function leaveCard(kind, was, next) {
    if (closeDialogs(kind)) note("The dialog about " + was + " was closed: the page now shows " + next + ". Open it again from that card.");
  }

  // fillSlots lists slots in table, each with its user first when withUser
  // (a pool key's holders); tick counts their ages and times left.
  function fillSlots(table, slots, withUser) {
    const body = table.tBodies[0];
    body.replaceChildren();
    for (const s of slots) {
      const tr = document.createElement("tr");
      tr.dataset.stream = s.stream_id;
      const left = cell("", "ttl");
      left.title = "expires at " + formatTime(s.expires_at);
      const age = cell(s.age_ms === undefined ? "—" : "", "age");
      if (s.started_at) age.title = "since " + formatTime(s.started_at);
      if (withUser) tr.append(cell(s.user_id || "—", "mono wrap"));
      tr.append(cell(s.stream_id, "mono"), callerCell(s.caller), cell(s.label || "—", "mono label"),
        cell(s.plan || "—", "nowrap"), age, left);
      body.append(tr);
    }
    show(table, slots.length > 0);
  }

  // fillTickets lists the acquires waiting in a queue in table, first
  // served first, each with its user when withUser (a pool key's
  // waiters); tick counts how long each has waited.
  function fillTickets(table, tickets, withUser) {
    const body = table.tBodies[0];
    body.replaceChildren();
    for (const q of tickets) {
      const tr = document.createElement("tr");
      tr.dataset.stream = q.stream_id;
      tr.append(cell(String(q.place)), cell(String(q.priority), "priority"));
      if (withUser) tr.append(cell(q.user_id || "—", "mono wrap"));
      tr.append(cell(q.stream_id, "mono"), cell(q.plan || "—", "nowrap"), callerCell(q.caller),
        cell(q.label || "—", "mono label"), timeCell(q.waiting_since, "nowrap"), cell("", "waited"));
      body.append(tr);
    }
    show(table, tickets.length > 0);
  }

  // unlisted says, under a table of slots, how many of used the answer
  // did not list: it names the first 1,000 to expire.
  function unlisted(el, listed, used) {
    el.textContent = "The first " + listed + " of " + used + " to expire; " + (used - listed) + " more not listed.";
    show(el, used > listed);
  }

  function renderSlots() {
    $("slots-user").textContent = shown.user;
    $("used").textContent = String(shown.used);
    $("used-label").textContent = shown.used === 1 ? "live slot" : "live slots";
    fillSlots($("slots"), shown.slots, false);
    show($("no-slots"), shown.slots.length === 0);
    unlisted($("slots-unlisted"), shown.slots.length, shown.used);
    fillTickets($("queue"), shown.queue, false);
    show($("no-queue"), shown.queue.length === 0);
    show($("user-no-caller"), shown.slots.concat(shown.queue).some((s) => !s.caller));
    renderLimit();
    const operator = role === "operator";
    $("release").disabled = !operator || shown.slots.length === 0;
    $("set-override").disabled = !operator;
    $("remove-override").disabled = !operator;
    show($("release-note"), !operator);
    renderOverride("", shown.override);
    show($("slots-card"), true);
    tick();
  }

  // SHADOW marks a plan or pool in shadow mode (enforce: false): it decides
  // as usual but refuses nothing, so what it counts can be above its limit.
  const SHADOW = "shadow — not enforced";

  // shadowTitle explains the mark of what, a plan or a pool, in a tooltip.
  function shadowTitle(what) {
    return what + " in shadow mode (enforce: false): its limit refuses nothing. An acquire over it is granted, takes its slot and is " +
      'counted as would_refuse (outcome="shadow_refused"), so the count can be above the limit. enforce: true turns the limit on.';
  }

  const OVER_LIMIT = "over the limit: the user's acquires are refused until enough slots end";
  const OVER_LIMIT_SHADOW = "over the limit, not enforced: shadow mode grants every acquire and counts it as would_refuse";

  // renderLimit shows what the user's acquires are judged by. A user has
  // no one limit: each acquire is judged by its own plan's (the
  // override's while one is in force) against every slot the user holds,
  // whatever their plans. So the page shows "used of limit" only when the
  // limit is one: an override, or a single plan held and waited under;
  // else each plan's. A plan in shadow mode is marked: it refuses nothing,
  // not even under an override.
  function renderLimit() {
    const o = shown.override;
    const plans = shown.planLimits;
    const shadow = plans.filter((p) => p.enforce === false);
    const byPlan = plans.map((p) => "plan " + p.plan + " allows " + p.limit + (p.enforce === false ? " (" + SHADOW + ")" : "")).join(", ");
    let limit;
    let text;
    if (o) {
      limit = o.max_concurrent_streams;
      text = "Limit " + limit + ": the override's, whatever the plan of the acquire" + (byPlan ? " (without it, " + byPlan + ")." : ".");
    } else if (plans.length === 1) {
      limit = plans[0].limit;
      text = "Limit " + limit + ": plan " + plans[0].plan + "'s, the plan of these slots. " + (shadow.length ?
        "The plan is in shadow mode (enforce: false): its limit refuses nothing; an acquire over it is granted and counted as would_refuse." :
        "An acquire under another plan is judged by that plan's limit, counting these slots too.");
    } else if (plans.length > 1) {
      text = "Limits by plan: " + byPlan + ". Each acquire is judged by its own plan's limit, counting every slot the user holds.";
    } else {
      text = "No limit to show: the limit is the plan's of each acquire, and this user holds no slot and waits under no plan. An override, when set, applies to every plan.";
    }
    show($("used-of"), limit !== undefined);
    $("limit").textContent = limit === undefined ? "" : String(limit);
    // The mark stands beside the limit shown when it is the shadow plan's;
    // else it names the plans in shadow mode.
    const names = shadow.map((p) => p.plan).join(", ");
    $("limit-shadow").textContent = !o && plans.length === 1 ? SHADOW : SHADOW + ": plan " + names;
    $("limit-shadow").title = shadowTitle("Plan " + names + (shadow.length === 1 ? " is" : " are"));
    show($("limit-shadow"), shadow.length > 0);
    const over = limit !== undefined && shown.used > limit;
    // Over a limit that refuses nothing is no lockout: said, not alarmed.
    const notEnforced = shadow.length > 0 && shadow.length === plans.length;
    $("over-limit").textContent = notEnforced ? OVER_LIMIT_SHADOW : OVER_LIMIT;
    $("over-limit").classList.toggle("not-enforced", notEnforced);
    show($("over-limit"), over);
    $("limit-note").textContent = text;
  }

  // renderOverride shows o, an override in force (or none), in the box
  // whose ids start with prefix: "" the user's, "pool-" the pool key's.
  function renderOverride(prefix, o) {
    show($(prefix + "override"), !!o);
    if (!o) return;
    $(prefix + "override-limit").textContent = o.max_concurrent_streams + (o.max_concurrent_streams === 1 ? " stream" : " streams");
    $(prefix + "override-until").textContent = formatTime(o.expires_at);
    $(prefix + "override-until").title = localTime(o.expires_at);
    $(prefix + "override-actor").textContent = o.actor || "—";
    $(prefix + "override-reason").textContent = o.reason;
  }

  // tick updates the countdowns and ages from the times Redis reported, so
  // they do not depend on this machine's clock agreeing with Redis's.
  function tick() {
    if (shown) {
      const elapsed = performance.now() - shown.fetchedAt;
      tickSlots($("slots"), shown.slots, elapsed);
      tickTickets($("queue"), shown.queue, elapsed);
      tickOverride("", shown.override, elapsed);
    }
    if (shownPool) {
      const elapsed = performance.now() - shownPool.fetchedAt;
      tickSlots($("holders"), shownPool.slots, elapsed);
      tickTickets($("waiters"), shownPool.waiters, elapsed);
      tickOverride("pool-", shownPool.override, elapsed);
    }
  }

  function tickSlots(table, slots, elapsed) {
    const rows = table.tBodies[0].rows;
    slots.forEach((s, i) => {
      const row = rows[i];
      if (!row) return;
      const left = s.ttl_ms - elapsed;
      const ttl = row.querySelector("td.ttl");
      ttl.textContent = formatLeft(left);
      ttl.classList.toggle("expired", left <= 0);
      if (s.age_ms !== undefined) row.querySelector("td.age").textContent = formatAge(s.age_ms + elapsed);
    });
  }

  // tickTickets counts on how long each waiting acquire has waited, from
  // what Redis reported.
  function tickTickets(table, tickets, elapsed) {
    const rows = table.tBodies[0].rows;
    tickets.forEach((q, i) => {
      const td = rows[i] && rows[i].querySelector("td.waited");
      if (td) td.textContent = formatAge(q.waited_ms + elapsed);
    });
  }

  function tickOverride(prefix, o, elapsed) {
    if (!o) return;
    const left = o.ttl_ms - elapsed;
    $(prefix + "override-left").textContent = formatLeft(left);
    $(prefix + "override-left").classList.toggle("expired", left <= 0);
  }

  // --- pool keys ---

  async function lookUpPool(pool, key) {
    const lookup = ++poolLookups;
    setError($("pool-lookup-error"), null);
    try {
      const res = await api("GET", poolPath(pool, key));
      if (lookup !== poolLookups) return; // a later look-up's answer is the one to show
      role = res.role || role;
      const d = res.data;
      if (shownPool && (shownPool.pool !== d.pool || shownPool.key !== d.key)) {
        leaveCard("pool", shownPool.pool + "=" + shownPool.key, d.pool + "=" + d.key);
      }
      shownPool = {
        pool: d.pool, key: d.key, slots: d.holders, waiters: d.waiters || [], used: d.used, limit: d.limit,
        enforce: d.enforce !== false, override: d.override || null, deleted: d.deleted === true, fetchedAt: performance.now(),
      };
      renderPool();
    } catch (err) {
      if (lookup !== poolLookups) return;
      // No card of the pool key shown before: its "Override cap" would
      // act on it, not on the key just asked about.
      hidePool();
      setError($("pool-lookup-error"), err);
    }
    refreshAudit();
  }

  function hidePool() {
    shownPool = null;
    show($("pool-card"), false);
    closeDialogs("pool");
  }

  function renderPool() {
    const p = shownPool;
    $("pool-name").textContent = p.pool + "=" + p.key;
    $("pool-used").textContent = String(p.used);
    $("pool-used-label").textContent = p.used === 1 ? "live membership" : "live memberships";
    $("pool-limit").textContent = p.deleted ?
      "pool deleted: its holders run on until they end, none joins it" + (p.limit === undefined ? "" : " (its last cap: " + p.limit + ")") :
      p.limit === undefined ? "not capped" : "the pool's cap: " + p.limit;
    // A pool in shadow mode refuses nothing: its key can hold more than
    // its cap. The mark qualifies the cap, so a key not capped has none.
    const shadow = !p.enforce && p.limit !== undefined;
    show($("pool-shadow"), shadow);
    $("pool-shadow").title = shadowTitle("Pool " + p.pool + " is");
    $("pool-over").textContent = shadow ? "over the cap, not enforced: shadow mode grants every stream and counts it as would_refuse" :
      "over the cap: streams that join the key are refused until enough end";
    $("pool-over").classList.toggle("not-enforced", shadow);
    // The override in force judges instead of the cap.
    const cap = p.override ? p.override.max_concurrent_streams : p.limit;
    show($("pool-over"), cap !== undefined && p.used > cap);
    fillSlots($("holders"), p.slots, true);
    show($("no-holders"), p.slots.length === 0);
    unlisted($("holders-unlisted"), p.slots.length, p.used);
    fillTickets($("waiters"), p.waiters, true);
    show($("no-waiters"), p.waiters.length === 0);
    show($("pool-no-caller"), p.slots.concat(p.waiters).some((s) => !s.caller));
    const operator = role === "operator";
    $("set-pool-override").disabled = !operator || p.limit === undefined || p.deleted;
    $("remove-pool-override").disabled = !operator;
    show($("pool-note"), !operator);
    renderOverride("pool-", p.override);
    show($("pool-card"), true);
    tick();
  }

  // --- release ---

  // openConfirm opens the release dialog on the user shown, and fixes it
  // there: confirming releases the user the dialog names.
  function openConfirm() {
    if (!shown) return;
    releasing = { user: shown.user, waiting: shown.queue.length > 0 };
    $("confirm-user").textContent = shown.user;
    $("confirm-count").textContent = String(shown.used);
    $("reason").value = "";
    updateReason();
    setError($("confirm-error"), null);
    $("confirm").showModal();
    $("reason").focus();
  }

  // A reason is bounded as the API bounds it: 1 to MAX_REASON characters
  // (code points, not the UTF-16 units of .length: an emoji is one) once
  // each run of whitespace is one space. SPACES are the characters Go's
  // unicode.IsSpace knows, by which the API collapses them (JavaScript's
  // \s differs: it holds U+FEFF and not U+0085).
  const MAX_REASON = 500;
  const SPACES = /[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/;

  // reasonIn returns the reason written in the textarea id, as the API
  // will record it, and shows its length in the element id-count.
  // Whether it may be sent: reasonOK.
  function reasonIn(id) {
    const reason = $(id).value.split(SPACES).filter(Boolean).join(" ");
    const n = [...reason].length;
    $(id + "-count").textContent = String(n);
    $(id + "-count").parentElement.classList.toggle("over", n > MAX_REASON);
    return reason;
  }

  function reasonOK(reason) {
    const n = [...reason].length;
    return n > 0 && n <= MAX_REASON;
  }

  function updateReason() {
    $("confirm-release").disabled = !reasonOK(reasonIn("reason"));
  }

  async function release() {
    const reason = reasonIn("reason");
    if (!reasonOK(reason) || !releasing) return;
    const { user, waiting } = releasing;
    $("confirm-release").disabled = true;
    try {
      const res = await api("POST", userPath(user, "release"), { reason });
      $("confirm").close();
      const ids = res.data.released;
      note("Released " + ids.length + (ids.length === 1 ? " slot" : " slots") + " of " + user +
        (ids.length ? ": " + ids.join(", ") : "") + " · audit id " + res.data.audit_id);
      const asked = userLookups + 1; // the number of the look-up below
      await lookUp(user);
      // The waiting acquires take the released slots a moment after the
      // release answered: look again to show them served, unless another
      // look-up was asked for since.
      if (waiting) setTimeout(() => { if (userLookups === asked && shown && shown.user === user) lookUp(user); }, 500);
    } catch (err) {
      setError($("confirm-error"), err);
      updateReason();
    }
  }

  // --- override ---

  // userTarget and poolTarget are what the override dialogs act on: the
  // user shown, or the pool key shown.
  function userTarget() {
    const user = shown.user;
    return {
      kind: "user", name: user, what: "limit", most: 1000, // a plan's limit, at most
      explain: "Until it expires, every acquire of this user, on any plan, is judged by this limit instead of the plan's. Slots already held are kept.",
      removeExplain: "The plan's limit applies again from the user's next acquire. Slots already held are kept.",
      path: () => userPath(user, "override"),
      again: () => lookUp(user),
    };
  }

  function poolTarget() {
    const { pool, key } = shownPool;
    return {
      kind: "pool", name: pool + "=" + key, what: "cap", most: 100000, // a pool key's cap, at most
      explain: "Until it expires, every stream that joins this pool key is judged by this limit instead of the pool's cap. Memberships already held are kept.",
      removeExplain: "The pool's cap applies again from the next stream that joins the key. Memberships already held are kept.",
      path: () => poolPath(pool, key, "override"),
      again: () => lookUpPool(pool, key),
    };
  }

  function openOverride(t) {
    target = t;
    $("override-user").textContent = t.name;
    $("override-what").textContent = t.what;
    $("override-explain").textContent = t.explain;
    $("override-streams").max = String(t.most);
    $("override-most").textContent = String(t.most);
    $("override-why").value = "";
    updateOverride();
    setError($("override-error"), null);
    $("override-dialog").showModal();
    $("override-streams").focus();
  }

  function updateOverride() {
    const ok = reasonOK(reasonIn("override-why")) && $("override-streams").value !== "" && $("override-for").value !== "";
    $("confirm-override").disabled = !ok;
  }

  async function setOverride() {
    const t = target;
    if (!t) return;
    const body = {
      max_concurrent_streams: Number($("override-streams").value),
      expires_in: Number($("override-for").value) * Number($("override-unit").value),
      reason: reasonIn("override-why"),
    };
    $("confirm-override").disabled = true;
    try {
      const res = await api("POST", t.path(), body);
      $("override-dialog").close();
      const o = res.data.override;
      note("Override set for " + t.name + ": " + o.max_concurrent_streams + (o.max_concurrent_streams === 1 ? " stream" : " streams") +
        " until " + formatTime(o.expires_at) + " · audit id " + res.data.audit_id);
      await t.again();
    } catch (err) {
      setError($("override-error"), err);
      updateOverride();
    }
  }

  function openRemove(t) {
    target = t;
    $("remove-user").textContent = t.name;
    $("remove-explain").textContent = t.removeExplain;
    $("remove-why").value = "";
    updateRemove();
    setError($("remove-error"), null);
    $("remove-dialog").showModal();
    $("remove-why").focus();
  }

  function updateRemove() {
    $("confirm-remove").disabled = !reasonOK(reasonIn("remove-why"));
  }

  async function removeOverride() {
    const reason = reasonIn("remove-why");
    const t = target;
    if (!reasonOK(reason) || !t) return;
    $("confirm-remove").disabled = true;
    try {
      const res = await api("DELETE", t.path(), { reason });
      $("remove-dialog").close();
      note((res.data.removed ? "Removed the override of " + t.name : t.name + " had no override in force") + " · audit id " + res.data.audit_id);
      await t.again();
    } catch (err) {
      setError($("remove-error"), err);
      updateRemove();
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
  // ids are in its tooltip), the override set, or whether one was removed;
  // for a refused set_override, the override it asked for, as sent.
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
    if (r.asked) {
      const parts = [];
      const n = r.asked.max_concurrent_streams;
      if (n !== undefined) parts.push(n + (n === 1 ? " stream" : " streams"));
      if (r.asked.expires_in !== undefined) parts.push("for " + r.asked.expires_in + "s");
      if (parts.length) return cell("asked " + parts.join(" "), "wrap");
    }
    return cell("");
  }

  const actionNames = {
    list_slots: "list slots", release_all: "release all", read_audit: "read audit",
    set_override: "set override", remove_override: "remove override",
  };

  function renderAudit(records) {
    const body = $("audit").tBodies[0];
    body.replaceChildren();
    const shownRecords = records.filter(worthShowing).slice(0, AUDIT_SHOWN);
    show($("audit"), shownRecords.length > 0);
    show($("no-audit"), shownRecords.length === 0);
    for (const r of shownRecords) {
      const tr = document.createElement("tr");
      tr.dataset.auditId = r.audit_id;
      const outcome = document.createElement("span");
      outcome.className = "badge " + (r.outcome === "ok" ? "ok" : "refused");
      outcome.textContent = r.outcome === "ok" ? "ok" : r.status + " " + r.outcome;
      if (r.detail) outcome.title = r.detail;
      const outcomeCell = cell("");
      outcomeCell.append(outcome);
      tr.append(
        timeCell(r.time, "nowrap"),
        cell(r.actor ? r.actor + " (" + r.role + ")" : "—", "nowrap"),
        cell(actionNames[r.action] || r.action, "nowrap"),
        cell(r.user_id || (r.pool ? r.pool + "=" + r.key : "—"), "mono wrap subject"),
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
    $("set-override").addEventListener("click", () => shown && openOverride(userTarget()));
    $("pool-lookup-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const pool = $("pool").value.trim();
      const key = $("pool-key").value.trim();
      show($("notice"), false);
      if (pool && key) lookUpPool(pool, key);
    });
    $("refresh-pool").addEventListener("click", () => shownPool && lookUpPool(shownPool.pool, shownPool.key));
    $("set-pool-override").addEventListener("click", () => shownPool && openOverride(poolTarget()));
    $("remove-pool-override").addEventListener("click", () => shownPool && openRemove(poolTarget()));
    for (const id of ["override-streams", "override-for", "override-why"]) {
      $(id).addEventListener("input", updateOverride);
    }
    $("cancel-override").addEventListener("click", () => $("override-dialog").close());
    $("override-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      setOverride();
    });
    $("remove-override").addEventListener("click", () => shown && openRemove(userTarget()));
    $("remove-why").addEventListener("input", updateRemove);
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
