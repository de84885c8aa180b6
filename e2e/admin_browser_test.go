package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/joishi/limiter/internal/browsertest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// screenshotDirEnv, when set, names a directory where the browser test also
// keeps its screenshots. They are always written to t.ArtifactDir(), which
// go test keeps with -artifacts and removes otherwise.
const screenshotDirEnv = "LIMITER_TEST_SCREENSHOTS"

// pngSignature opens every PNG file.
const pngSignature = "\x89PNG\r\n\x1a\n"

// TestAdminPageInChromium drives the admin page in real headless Chromium,
// on the admin listener (admin.addr, not the API's port): sign in, look up
// a user holding 2 slots and see who holds them since when (age, caller,
// label, plan, time left), see failed look-ups hide them, set an override
// of the user's limit and see it judge the user's acquires, remove it, see
// an acquire wait in the user's queue, release the slots with a reason, see
// the waiting acquire take a slot and the changes in the recent actions;
// then look up a pool key whose name holds a '/', see who holds it, set
// and remove an override of its cap and see it judge the key's streams,
// see an acquire wait for it, by place and priority, and see failed
// look-ups hide it; see a plan and a pool in shadow mode (enforce: false)
// marked "shadow — not enforced" beside their limit, their "3 of 1" not
// taken for a lockout nor breaking the layout, on a narrow screen too,
// and the limits that refuse left unmarked. Along the way the page
// explains itself to a new user: where a token comes from, the user's
// limit (the plan's or the override's), an empty Caller, times in UTC,
// empty tables; each state is screenshot. The page must raise no console
// error (a CSP violation is one).
func TestAdminPageInChromium(t *testing.T) {
	t.Parallel()
	testenv.Chromium(t) // at once, before the servers start, when it is missing
	apiTokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(apiTokens, []byte("chat-api "+e2eAppToken+" *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startBrowserServer(t, "api:\n  tokensFile: "+apiTokens+"\n", browserPools)
	app := &http.Client{Timeout: 10 * time.Second, Transport: bearer(e2eAppToken)}
	user := "page-" + randomID()
	labels := []string{"pod-7/gpt-4o", "pod-9/llama-3.1-8b"}
	acquire := func(req httpapi.AcquireRequest) int {
		t.Helper()
		var res httpapi.AcquireResponse
		status, _, body := call(t, app, "POST", srv.API+httpapi.PathAcquire, req, nil)
		if status == http.StatusOK {
			if err := json.Unmarshal(body, &res); err != nil || res.Degraded {
				t.Fatalf("acquire: %s, %v; want granted, not degraded", body, err)
			}
		}
		return status
	}
	acquireAs := func(label string) int {
		t.Helper()
		return acquire(httpapi.AcquireRequest{UserID: user, Plan: "long", Label: label})
	}
	for _, label := range labels {
		if status := acquireAs(label); status != http.StatusOK {
			t.Fatalf("acquire labelled %s: got %d, want 200", label, status)
		}
	}

	browser := browsertest.Start(t, chromedp.Flag("hide-scrollbars", true), chromedp.WindowSize(1280, 1000))
	ctx := browser.Ctx

	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	eval := func(expr string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluating %s: %v", expr, err)
		}
		return s
	}
	artifacts := t.ArtifactDir()
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if len(png) <= len(pngSignature) || !strings.HasPrefix(string(png), pngSignature) {
			t.Fatalf("screenshot %s: got %d bytes starting %q, want a PNG", name, len(png), png[:min(len(png), 8)])
		}
		path := filepath.Join(artifacts, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		if keep := os.Getenv(screenshotDirEnv); keep != "" {
			_ = os.WriteFile(filepath.Join(keep, name), png, 0o644)
		}
		t.Logf("screenshot: %s", path)
	}
	poll := func(what, expr string) {
		t.Helper()
		step(what, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(15*time.Second))(ctx, tg)
			return err
		}))
	}

	// visible says whether the element of id is shown.
	visible := func(id string) bool {
		t.Helper()
		return eval(`String(document.getElementById(`+jsString(id)+`).offsetParent !== null)`) == "true"
	}
	// wantText checks that the element of sel is shown and that its text
	// as rendered (hidden parts left out, whitespace runs as one space)
	// holds each of wants.
	wantText := func(what, sel string, wants ...string) {
		t.Helper()
		got := strings.Join(strings.Fields(eval(`document.querySelector(`+jsString(sel)+`).innerText`)), " ")
		if eval(`String(document.querySelector(`+jsString(sel)+`).offsetParent !== null)`) != "true" {
			t.Errorf("%s (%s): hidden, want it shown holding %q", what, sel, wants)
		}
		for _, want := range wants {
			if !strings.Contains(got, want) {
				t.Errorf("%s (%s): got %q, want it to hold %q", what, sel, got, want)
			}
		}
	}
	utc := regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`)

	step("open the page",
		chromedp.Navigate(srv.Admin+httpapi.PathAdminPage),
		chromedp.WaitVisible(chromedp.ID("token")),
	)
	// A new user is told where a token comes from.
	wantText("sign-in help", "#token-help", "admin.tokensFile", "one line per token", "name role token", "viewer", "operator", "Support admin")
	shot("admin-sign-in.png")
	step("sign in as the operator",
		chromedp.SendKeys(chromedp.ID("token"), e2eOperatorToken),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("app")),
	)
	if got := text("#role"); got != "operator" {
		t.Errorf("signed-in role: got %q, want operator", got)
	}
	if got := eval(`sessionStorage.getItem("limiter.admin.token") || ""`); got != e2eOperatorToken {
		t.Errorf("sessionStorage token: got %q, want the token signed in with", got)
	}
	if got := eval(`document.cookie`); got != "" {
		t.Errorf("document.cookie: got %q, want none", got)
	}
	// Only reads so far, which the recent actions leave out.
	poll("the empty recent actions say so", `!document.getElementById("no-audit").hidden`)
	wantText("empty recent actions", "#no-audit", "No changes and no refused calls yet.")

	step("look up the user",
		chromedp.SendKeys(chromedp.ID("user"), user),
		chromedp.Click(chromedp.ID("lookup")),
		chromedp.WaitVisible(chromedp.ID("slots-card")),
	)
	poll("the user's 2 slots are listed", `document.querySelectorAll("#slots tbody tr").length === 2 && document.getElementById("used").textContent === "2"`)

	// Who holds each slot, since when: caller, label, plan; the age counts
	// up and the time left down, both m:ss.
	rows := eval(`[...document.querySelectorAll("#slots tbody tr")].map(tr => [...tr.cells].slice(1, 4).map(td => td.textContent).join("|")).sort().join("\n")`)
	if want := "chat-api|" + labels[0] + "|long\nchat-api|" + labels[1] + "|long"; rows != want {
		t.Errorf("slot rows (caller|label|plan): got\n%s\nwant\n%s", rows, want)
	}
	countdown := regexp.MustCompile(`^\d+:\d\d$`)
	first, firstAge := text("#slots tbody tr td.ttl"), text("#slots tbody tr td.age")
	step("wait", chromedp.Sleep(1500*time.Millisecond))
	second, secondAge := text("#slots tbody tr td.ttl"), text("#slots tbody tr td.age")
	if !countdown.MatchString(first) || !countdown.MatchString(second) || second >= first {
		t.Errorf("countdown: got %q then %q 1.5s later, want m:ss going down", first, second)
	}
	if !countdown.MatchString(firstAge) || !countdown.MatchString(secondAge) || secondAge <= firstAge {
		t.Errorf("age: got %q then %q 1.5s later, want m:ss going up", firstAge, secondAge)
	}
	// The user's limit: both slots are of plan long, which allows 3.
	wantText("user's summary", "#slots-card .summary", "2 of 3 live slots")
	wantText("user's limit", "#limit-note", "Limit 3: plan long's")
	if visible("over-limit") || visible("user-no-caller") || visible("no-slots") || visible("limit-shadow") {
		t.Errorf("2 slots of 3 of an enforced plan, each with a caller: over-limit %v, no-caller note %v, no-slots %v, shadow mark %v; want none shown",
			visible("over-limit"), visible("user-no-caller"), visible("no-slots"), visible("limit-shadow"))
	}
	wantText("no acquire waiting", "#no-queue", "Nobody waiting.")
	shot("admin-before-release.png")

	// A failed look-up leaves no card of the user shown before: its
	// "Release all slots" would release them, not the user asked about.
	// "." and ".." fail in the page itself: a browser resolves them as path
	// steps, even escaped, so the page points to the CLI.
	for _, tc := range []struct{ id, want string }{
		{"a b", "400 invalid_user_id"},
		{"..", "Use the CLI"},
		{".", "Use the CLI"},
	} {
		step("look up "+tc.id+", which fails",
			chromedp.SetValue(chromedp.ID("user"), tc.id),
			chromedp.Click(chromedp.ID("lookup")),
		)
		poll("the look-up of "+tc.id+" fails and hides the slots card",
			`document.getElementById("lookup-error").textContent.includes(`+jsString(tc.want)+`) && document.getElementById("slots-card").hidden`)
		if got := eval(`String(document.getElementById("release").offsetParent === null)`); got != "true" {
			t.Errorf("after the failed look-up of %q: the release button is shown, want it gone", tc.id)
		}
	}
	shot("admin-failed-lookup.png")
	step("look up the user again",
		chromedp.SetValue(chromedp.ID("user"), user),
		chromedp.Click(chromedp.ID("lookup")),
	)
	poll("the user's 2 slots are listed again", `!document.getElementById("slots-card").hidden && document.getElementById("slots-user").textContent === `+jsString(user)+
		` && document.querySelectorAll("#slots tbody tr").length === 2 && document.getElementById("lookup-error").hidden`)

	// Support overrides the limit: 5 streams for a day, set from the page.
	const overrideReason = "ticket 4813: 5 streams for the launch"
	step("open the override dialog",
		chromedp.Click(chromedp.ID("set-override")),
		chromedp.WaitVisible(chromedp.ID("override-why")),
	)
	if got := eval(`String(document.getElementById("confirm-override").disabled)`); got != "true" {
		t.Errorf("set-override button without a reason: disabled %s, want true", got)
	}
	// setOverride fills in the open override dialog (unit: seconds, as
	// its select's values) and confirms.
	setOverride := func(streams, forN, unit, reason string) {
		t.Helper()
		step("fill in "+streams+" streams for "+forN+" × "+unit+"s and a reason",
			chromedp.SetValue(chromedp.ID("override-streams"), streams),
			chromedp.SetValue(chromedp.ID("override-for"), forN),
			chromedp.SetValue(chromedp.ID("override-unit"), unit),
			chromedp.SendKeys(chromedp.ID("override-why"), reason),
			chromedp.Click(chromedp.ID("confirm-override")),
		)
	}
	setOverride("5", "1", "86400", overrideReason)
	poll("the override is shown", `!document.getElementById("override").hidden && document.getElementById("override-limit").textContent === "5 streams"`)
	if got := text("#override"); !strings.Contains(got, "set by opal: "+overrideReason) {
		t.Errorf("override shown: got %q, want it set by opal with the reason", got)
	}
	if left := text("#override-left"); !regexp.MustCompile(`^1 day 0:00:\d\d$|^23:59:\d\d$`).MatchString(left) {
		t.Errorf("override time left: got %q, want about a day (1 day 0:00:ss or 23:59:ss)", left)
	}
	if notice := text("#notice"); !strings.HasPrefix(notice, "Override set for "+user+": 5 streams until") || !strings.Contains(notice, " UTC · audit id") {
		t.Errorf("notice: got %q, want the override confirmed, its end in UTC", notice)
	}
	if until := text("#override-until"); !utc.MatchString(until) {
		t.Errorf("override until: got %q, want YYYY-MM-DD hh:mm:ss UTC", until)
	}
	wantText("user's summary under an override", "#slots-card .summary", "2 of 5 live slots")
	wantText("user's limit under an override", "#limit-note", "Limit 5: the override's, whatever the plan", "without it, plan long allows 3")
	shot("admin-override.png")
	var listed httpapi.AdminSlotsResponse
	if status, body := srv.admin(t, "GET", httpapi.AdminUserSlotsPath(user), e2eViewerToken, nil, &listed); status != http.StatusOK ||
		listed.Override == nil || listed.Override.MaxConcurrentStreams != 5 || listed.Override.Actor != "opal" || listed.Override.Reason != overrideReason {
		t.Fatalf("the override set from the page: got %d %s, want 5 streams by opal", status, body)
	}
	// Plan long allows 3: the override lets the user hold 5, and no more.
	for i := range 3 {
		if status := acquireAs(fmt.Sprintf("extra-%d", i)); status != http.StatusOK {
			t.Fatalf("acquire %d of plan long (3) under an override of 5: got %d, want 200", i+3, status)
		}
	}
	if status := acquireAs("extra-3"); status != http.StatusTooManyRequests {
		t.Fatalf("6th acquire under an override of 5: got %d, want 429", status)
	}
	step("refresh the slots", chromedp.Click(chromedp.ID("refresh-slots")))
	poll("the user's 5 slots are listed", `document.getElementById("used").textContent === "5"`)
	wantText("user's summary at the override's limit", "#slots-card .summary", "5 of 5 live slots")

	step("open the removal dialog",
		chromedp.Click(chromedp.ID("remove-override")),
		chromedp.WaitVisible(chromedp.ID("remove-why")),
		chromedp.SendKeys(chromedp.ID("remove-why"), "ticket 4813: launch over"),
		chromedp.Click(chromedp.ID("confirm-remove")),
	)
	poll("the override is gone", `document.getElementById("override").hidden && document.getElementById("notice").textContent.startsWith("Removed the override of ")`)
	if status := acquireAs("after-removal"); status != http.StatusTooManyRequests {
		t.Errorf("acquire after the override was removed (5 held, plan long allows 3): got %d, want 429", status)
	}
	// 5 held, plan long allows 3: the page says the user is over it.
	poll("the user is shown over the plan's limit", `document.getElementById("limit").textContent === "3"`)
	wantText("user's summary over the limit", "#slots-card .summary", "5 of 3 live slots", "over the limit: the user's acquires are refused")
	if visible("limit-shadow") || eval(`String(document.getElementById("over-limit").classList.contains("not-enforced"))`) != "false" {
		t.Errorf("5 of 3 of plan long, which enforces: shadow mark %v, over-limit classes %q; want no mark, the alarm of a refusing limit",
			visible("limit-shadow"), eval(`document.getElementById("over-limit").className`))
	}

	// An acquire of plan queued (2 streams, waits up to a minute) waits in
	// the user's queue: the page lists it, and the time it has waited goes
	// up.
	const waiter = "page-waiter"
	waited := waitingAcquireAs(context.Background(), e2eAppToken, srv.API, user, "queued", waiter, 60_000)
	eventually(t, 10*time.Second, "the waiting acquire is in the queue", func() bool {
		var slots httpapi.AdminSlotsResponse
		status, _ := srv.admin(t, "GET", httpapi.AdminUserSlotsPath(user), e2eViewerToken, nil, &slots)
		return status == http.StatusOK && len(slots.Queue) == 1 && slots.Queue[0].StreamID == waiter
	})
	step("refresh the slots", chromedp.Click(chromedp.ID("refresh-slots")))
	poll("the waiting acquire is listed", `document.querySelectorAll("#queue tbody tr").length === 1 && !document.getElementById("queue").hidden && document.getElementById("no-queue").hidden`)
	if got, want := eval(`[...document.querySelector("#queue tbody tr").cells].slice(0, 4).map(td => td.textContent).join("|")`), "1|0|"+waiter+"|queued"; got != want {
		t.Errorf("waiting acquire listed (place|priority|stream|plan): got %q, want %q", got, want)
	}
	waitedFirst := text("#queue tbody tr td.waited")
	step("wait", chromedp.Sleep(1500*time.Millisecond))
	waitedSecond := text("#queue tbody tr td.waited")
	if !countdown.MatchString(waitedFirst) || !countdown.MatchString(waitedSecond) || waitedSecond <= waitedFirst {
		t.Errorf("waited: got %q then %q 1.5s later, want m:ss going up", waitedFirst, waitedSecond)
	}
	if since := eval(`document.querySelector("#queue tbody tr").cells[6].textContent`); !utc.MatchString(since) {
		t.Errorf("waiting since: got %q, want YYYY-MM-DD hh:mm:ss UTC", since)
	}
	// Slots of plan long, an acquire of plan queued: no one limit, each
	// plan's.
	if visible("used-of") {
		t.Errorf("summary %q under two plans: want no single limit", text("#slots-card .summary"))
	}
	wantText("user's limits by plan", "#limit-note", "Limits by plan: plan long allows 3, plan queued allows 2")
	shot("admin-queue.png")

	const reason = "ticket 4812: locked out after a crash"
	step("open the confirmation",
		chromedp.Click(chromedp.ID("release")),
		chromedp.WaitVisible(chromedp.ID("reason")),
	)
	if got := eval(`String(document.getElementById("confirm-release").disabled)`); got != "true" {
		t.Errorf("confirm button without a reason: disabled %s, want true", got)
	}
	step("give a reason", chromedp.SendKeys(chromedp.ID("reason"), reason))
	shot("admin-confirm.png")
	step("release",
		chromedp.Click(chromedp.ID("confirm-release")),
		chromedp.WaitVisible(chromedp.ID("notice")),
	)
	// The waiting acquire takes one of the slots released.
	poll("the user holds the waiter's slot alone", `document.getElementById("used").textContent === "1" && document.querySelector("#slots tbody tr").dataset.stream === `+jsString(waiter)+
		` && !document.getElementById("no-queue").hidden`)
	select {
	case a := <-waited:
		if a.status != http.StatusOK {
			t.Errorf("the waiting acquire: got %d %s (%v), want 200 once support released the slots", a.status, a.body, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the waiting acquire got no answer after support released the slots")
	}

	notice := text("#notice")
	auditID := regexp.MustCompile(`audit id ([0-9a-f]{16})`).FindStringSubmatch(notice)
	if !strings.HasPrefix(notice, "Released 5 slots of "+user) || auditID == nil {
		t.Fatalf("notice: got %q, want 5 slots released and an audit id", notice)
	}
	row := `#audit tr[data-audit-id="` + auditID[1] + `"]`
	poll("the release is in the recent actions", `document.querySelector('`+row+`') !== null`)
	poll("the override's changes are in the recent actions", `[...document.querySelectorAll("#audit tbody tr")].some(tr => tr.cells[2].textContent === "set override" && tr.cells[5].textContent.startsWith("5 streams until")) &&
		[...document.querySelectorAll("#audit tbody tr")].some(tr => tr.cells[2].textContent === "remove override" && tr.cells[5].textContent === "removed")`)
	// A refused set_override says what it asked for: one stream over the
	// limit of an override, as sent.
	tooMany, day := httpapi.MaxOverrideStreams+1, int64(86400)
	if status, body := srv.admin(t, "POST", httpapi.AdminUserOverridePath(user), e2eOperatorToken,
		httpapi.AdminOverrideRequest{MaxConcurrentStreams: &tooMany, ExpiresIn: &day, Reason: "ticket 9: too many"}, nil); status != http.StatusBadRequest {
		t.Fatalf("an override of %d streams: got %d %s, want 400", tooMany, status, body)
	}
	step("refresh the recent actions", chromedp.Click(chromedp.ID("refresh-audit")))
	poll("the refused override says what it asked for", fmt.Sprintf(`[...document.querySelectorAll("#audit tbody tr")].some(tr => tr.cells[2].textContent === "set override" && tr.cells[4].textContent.startsWith("400 ") && tr.cells[5].textContent === "asked %d streams for 86400s")`, tooMany))
	entry := text(row)
	for _, want := range []string{"opal (operator)", "release all", user, "ok", "5 slots", reason} {
		if !strings.Contains(entry, want) {
			t.Errorf("audit entry: got %q, want it to hold %q", entry, want)
		}
	}
	// The recent actions are releases and refused calls, not the reads
	// (this page's own look-ups and audit reads among them).
	poll("the refused look-up is in the recent actions", `[...document.querySelectorAll("#audit tbody tr")].some(tr => tr.cells[3].textContent === "a b" && tr.cells[4].textContent.includes("invalid_user_id"))`)
	if got := eval(`[...document.querySelectorAll("#audit tbody tr")].filter(tr => !["release all", "set override", "remove override"].includes(tr.cells[2].textContent) && tr.querySelector(".badge.ok")).map(tr => tr.textContent).join("\n")`); got != "" {
		t.Errorf("recent actions: got successful reads\n%s\nwant only changes and refused calls", got)
	}
	shot("admin-after-release.png")

	// Server side: the released slots are gone, the waiter holds one.
	var slots httpapi.AdminSlotsResponse
	if status, body := srv.admin(t, "GET", httpapi.AdminUserSlotsPath(user), e2eViewerToken, nil, &slots); status != http.StatusOK || slots.Used != 1 || len(slots.Queue) != 0 {
		t.Errorf("slots after the release: got %d %s, want 200 with the waiter's slot and no queue", status, body)
	}

	// On an open slot API (no api.tokensFile) no caller is recorded. This
	// server has callers: the page is shown its own answer without them.
	eval(`window.realFetch = window.fetch;
		window.fetch = async (...args) => {
			const resp = await window.realFetch(...args);
			if (!String(args[0]).endsWith("/slots")) return resp;
			const data = await resp.json();
			for (const s of data.slots.concat(data.queue)) delete s.caller;
			return new Response(JSON.stringify(data), { status: resp.status, headers: resp.headers });
		};
		""`)
	step("refresh the slots, told no caller", chromedp.Click(chromedp.ID("refresh-slots")))
	poll("the missing caller is explained", `!document.getElementById("user-no-caller").hidden`)
	wantText("no-caller note", "#user-no-caller", "no caller recorded", "api.tokensFile")
	if got := eval(`document.querySelector("#slots tbody td.no-caller").title`); !strings.Contains(got, "the slot API was open") {
		t.Errorf("tooltip of an empty Caller: got %q, want it to say the slot API was open", got)
	}
	shot("admin-no-caller.png")
	eval(`window.fetch = window.realFetch; ""`)
	step("refresh the slots", chromedp.Click(chromedp.ID("refresh-slots")))
	poll("the caller is back", `document.getElementById("user-no-caller").hidden && document.querySelector("#slots tbody tr").cells[1].textContent === "chat-api"`)

	// A pool key: the model's name holds a '/', which the page sends
	// escaped, as one segment.
	joinLlama := func(u string) int {
		t.Helper()
		return acquire(httpapi.AcquireRequest{UserID: u, Plan: "long", Label: "pod-3", Pools: map[string]string{"model": browserLlama}})
	}
	holders := []string{"page-pool-a-" + randomID(), "page-pool-b-" + randomID()}
	for _, u := range holders {
		if status := joinLlama(u); status != http.StatusOK {
			t.Fatalf("acquire of %s joining model=%s: got %d, want 200", u, browserLlama, status)
		}
	}
	if status := joinLlama("page-pool-c-" + randomID()); status != http.StatusTooManyRequests {
		t.Fatalf("a 3rd stream joining model=%s (cap 2): got %d, want 429", browserLlama, status)
	}
	step("look up the pool key",
		chromedp.SetValue(chromedp.ID("pool"), "model"),
		chromedp.SetValue(chromedp.ID("pool-key"), browserLlama),
		chromedp.Click(chromedp.ID("pool-lookup")),
		chromedp.WaitVisible(chromedp.ID("pool-card")),
	)
	poll("the pool key's 2 holders are listed", `document.querySelectorAll("#holders tbody tr").length === 2 && document.getElementById("pool-used").textContent === "2"`)
	if got := text("#pool-name"); got != "model="+browserLlama {
		t.Errorf("pool key shown: got %q, want model=%s", got, browserLlama)
	}
	if got := text("#pool-limit"); got != "the pool's cap: 2" {
		t.Errorf("pool key's cap: got %q, want the pool's cap: 2", got)
	}
	if visible("pool-shadow") || visible("pool-over") {
		t.Errorf("2 of the cap 2 of pool model, which enforces: shadow mark %v, over the cap %v; want neither shown", visible("pool-shadow"), visible("pool-over"))
	}
	wantText("no acquire waiting for the key", "#no-waiters", "Nobody waiting for this key.")
	rows = eval(`[...document.querySelectorAll("#holders tbody tr")].map(tr => [...tr.cells].slice(0, 5).filter((_, i) => i !== 1).map(td => td.textContent).join("|")).sort().join("\n")`)
	slices.Sort(holders)
	if want := holders[0] + "|chat-api|pod-3|long\n" + holders[1] + "|chat-api|pod-3|long"; rows != want {
		t.Errorf("holder rows (user|caller|label|plan): got\n%s\nwant\n%s", rows, want)
	}
	holderAge := text("#holders tbody tr td.age")
	// The page ticks every 250ms: 1.5s is past a whole second whatever
	// the phase.
	step("wait", chromedp.Sleep(1500*time.Millisecond))
	if later := text("#holders tbody tr td.age"); !countdown.MatchString(holderAge) || !countdown.MatchString(later) || later <= holderAge {
		t.Errorf("holder age: got %q then %q 1.5s later, want m:ss going up", holderAge, later)
	}

	// A pool deleted while streams hold its keys: the page says so, and
	// offers no new override. It is shown its own answer as a replica
	// started since the deletion gives it: deleted, no cap known.
	eval(`window.realFetch = window.fetch;
		window.fetch = async (...args) => {
			const resp = await window.realFetch(...args);
			if (!String(args[0]).includes("/v1/admin/pools/")) return resp;
			const data = await resp.json();
			data.deleted = true;
			delete data.limit;
			return new Response(JSON.stringify(data), { status: resp.status, headers: resp.headers });
		};
		""`)
	step("refresh the pool key, told its pool is deleted", chromedp.Click(chromedp.ID("refresh-pool")))
	poll("the pool key's pool is said deleted, no override offered", `document.getElementById("pool-limit").textContent === "pool deleted: its holders run on until they end, none joins it" && document.getElementById("set-pool-override").disabled`)
	eval(`window.fetch = window.realFetch; ""`)
	step("refresh the pool key", chromedp.Click(chromedp.ID("refresh-pool")))
	poll("the pool key's cap is back", `document.getElementById("pool-limit").textContent === "the pool's cap: 2" && !document.getElementById("set-pool-override").disabled`)

	const poolReason = "ticket 4900: launch traffic"
	step("open the pool key's override dialog",
		chromedp.Click(chromedp.ID("set-pool-override")),
		chromedp.WaitVisible(chromedp.ID("override-why")),
	)
	if got := text("#override-dialog h2"); got != "Override the cap of model="+browserLlama {
		t.Errorf("override dialog title: got %q, want it to name the pool key's cap", got)
	}
	// Above a plan's most (1000): a pool key's cap goes to 100000.
	if got := text("label[for=override-streams]"); got != "Concurrent streams (0–100000)" {
		t.Errorf("pool key's override field: label %q; want it bounded by a pool key's cap, 0–100000", got)
	}
	setOverride("5000", "1", "3600", poolReason)
	poll("the pool key's override is shown", `!document.getElementById("pool-override").hidden && document.getElementById("pool-override-limit").textContent === "5000 streams"`)
	if notice := text("#notice"); !strings.HasPrefix(notice, "Override set for model="+browserLlama+": 5000 streams until") {
		t.Errorf("notice: got %q, want the pool key's override confirmed", notice)
	}
	if got := text("#pool-override"); !strings.Contains(got, "set by opal: "+poolReason) {
		t.Errorf("pool key's override shown: got %q, want it set by opal with the reason", got)
	}
	shot("admin-pool-key.png")
	if status := joinLlama("page-pool-c-" + randomID()); status != http.StatusOK {
		t.Fatalf("a 3rd stream joining model=%s under an override of 5000: got %d, want 200", browserLlama, status)
	}
	step("remove the pool key's override",
		chromedp.Click(chromedp.ID("remove-pool-override")),
		chromedp.WaitVisible(chromedp.ID("remove-why")),
		chromedp.SendKeys(chromedp.ID("remove-why"), "ticket 4900: launch over"),
		chromedp.Click(chromedp.ID("confirm-remove")),
	)
	poll("the pool key's override is gone", `document.getElementById("pool-override").hidden && document.getElementById("notice").textContent.startsWith("Removed the override of model=")`)
	poll("the pool key's 3 holders are listed", `document.getElementById("pool-used").textContent === "3"`)
	if status := joinLlama("page-pool-d-" + randomID()); status != http.StatusTooManyRequests {
		t.Errorf("a stream after the override was removed (3 held, cap 2): got %d, want 429", status)
	}
	wantText("pool key over its cap, enforced", "#pool-card .summary", "3 live memberships", "over the cap: streams that join the key are refused")
	if visible("pool-shadow") {
		t.Errorf("3 of the cap 2 of pool model, which enforces: the shadow mark is shown, want it hidden")
	}
	poll("the pool key's override is in the recent actions", `[...document.querySelectorAll("#audit tbody tr")].some(tr => tr.cells[2].textContent === "set override" && tr.cells[3].textContent === `+jsString("model="+browserLlama)+`)`)

	// An acquire of plan urgent (priority 5) waits for the full key: the
	// page lists it under the holders, by place, with its priority, under
	// its own user though its stream id spells a holder's.
	poolWaiter := "page-pool-w-" + randomID()
	waitCtx, stopWaiting := context.WithCancel(context.Background())
	defer stopWaiting()
	poolWaited := make(chan answer, 1)
	go func() {
		poolWaited <- postAs(waitCtx, e2eAppToken, srv.API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: poolWaiter, Plan: "urgent", StreamID: holders[0],
			Label: "pod-5", WaitMs: 30_000, Pools: map[string]string{"model": browserLlama}})
	}()
	eventually(t, 10*time.Second, "the waiting acquire is in the pool key's queue", func() bool {
		var key httpapi.AdminPoolKeyResponse
		status, _ := srv.admin(t, "GET", httpapi.AdminPoolKeyPath("model", browserLlama), e2eViewerToken, nil, &key)
		return status == http.StatusOK && len(key.Waiters) == 1
	})
	step("refresh the pool key", chromedp.Click(chromedp.ID("refresh-pool")))
	poll("the pool key's waiter is listed", `document.querySelectorAll("#waiters tbody tr").length === 1 && !document.getElementById("waiters").hidden && document.getElementById("no-waiters").hidden`)
	if got, want := eval(`[...document.querySelector("#waiters tbody tr").cells].slice(0, 7).map(td => td.textContent).join("|")`),
		"1|5|"+poolWaiter+"|"+holders[0]+"|urgent|chat-api|pod-5"; got != want {
		t.Errorf("pool key's waiter (place|priority|user|stream|plan|caller|label): got %q, want %q", got, want)
	}
	if got := text("#waiters tbody tr td.waited"); !countdown.MatchString(got) {
		t.Errorf("pool key's waiter has waited %q, want m:ss", got)
	}
	if since := eval(`document.querySelector("#waiters tbody tr").cells[7].textContent`); !utc.MatchString(since) {
		t.Errorf("pool key's waiter waiting since: got %q, want YYYY-MM-DD hh:mm:ss UTC", since)
	}
	if visible("no-holders") || visible("no-waiters") || visible("pool-no-caller") {
		t.Errorf("a key with holders and a waiter, each with a caller: no-holders %v, no-waiters %v, no-caller note %v; want none shown",
			visible("no-holders"), visible("no-waiters"), visible("pool-no-caller"))
	}
	shot("admin-pool-waiters.png")
	stopWaiting()
	if a := <-poolWaited; a.status == http.StatusOK {
		t.Errorf("the pool key's waiter: got 200 %s, want no grant (the key stayed full)", a.body)
	}

	// A failed look-up hides the pool key shown before.
	for _, tc := range []struct{ pool, key, want string }{
		{"region", "eu", "422 unknown_pool"},
		{"model", "gpt 4o", "400 invalid_pool_key"},
		{"model", "..", "Use the CLI"},
	} {
		step("look up "+tc.pool+"="+tc.key+", which fails",
			chromedp.SetValue(chromedp.ID("pool"), tc.pool),
			chromedp.SetValue(chromedp.ID("pool-key"), tc.key),
			chromedp.Click(chromedp.ID("pool-lookup")),
		)
		poll("the look-up of "+tc.pool+"="+tc.key+" fails and hides the pool key", `document.getElementById("pool-lookup-error").textContent.includes(`+jsString(tc.want)+`) && document.getElementById("pool-card").hidden`)
	}

	// A plan in shadow mode (trial: 1 stream, enforce: false) refuses
	// nothing: its user holds 3 of 1, shown beside the mark "shadow — not
	// enforced" and not as a lockout, within its card, on a narrow
	// screen too.
	shadowUser := "page-shadow-" + randomID()
	for i := range 3 {
		var res httpapi.AcquireResponse
		status, _, body := call(t, app, "POST", srv.API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: shadowUser, Plan: "trial", Label: fmt.Sprintf("pod-%d", i)}, nil)
		if status != http.StatusOK || json.Unmarshal(body, &res) != nil || (res.WouldRefuse == "stream_limit_reached") != (i > 0) {
			t.Fatalf("acquire %d of plan trial (1, shadow mode): got %d %s, want 200, would_refuse from the 2nd on", i+1, status, body)
		}
	}
	step("look up the user of a plan in shadow mode",
		chromedp.SetValue(chromedp.ID("user"), shadowUser),
		chromedp.Click(chromedp.ID("lookup")),
	)
	poll("the shadow plan's user is shown", `document.getElementById("slots-user").textContent === `+jsString(shadowUser)+
		` && document.getElementById("used").textContent === "3"`)
	wantText("shadow plan's summary", "#slots-card .summary", "3 of 1 live slots", "shadow — not enforced", "over the limit, not enforced")
	wantText("shadow plan's limit", "#limit-note", "Limit 1: plan trial's", "shadow mode (enforce: false)", "refuses nothing")
	if got := text("#slots-card .summary"); strings.Contains(got, "refused until") {
		t.Errorf("shadow plan's summary: got %q, want no word of a refusal (the plan refuses nothing)", got)
	}
	if got := eval(`document.getElementById("over-limit").className`); got != "over not-enforced" {
		t.Errorf("shadow plan's over-limit note: classes %q, want \"over not-enforced\" (said, not alarmed)", got)
	}
	if got := eval(`document.getElementById("limit-shadow").title`); !strings.Contains(got, "Plan trial is in shadow mode") || !strings.Contains(got, "would_refuse") {
		t.Errorf("shadow mark's tooltip: got %q, want it to name plan trial in shadow mode and would_refuse", got)
	}
	// fits checks that nothing is wider than the page and that the mark
	// of id lies within its card.
	fits := func(what, mark, card string) {
		t.Helper()
		if got := eval(`String(document.documentElement.scrollWidth <= document.documentElement.clientWidth)`); got != "true" {
			t.Errorf("%s: the page is wider than the window (%s px of %s)", what,
				eval(`String(document.documentElement.scrollWidth)`), eval(`String(document.documentElement.clientWidth)`))
		}
		inside := `(() => { const c = document.getElementById(` + jsString(card) + `).getBoundingClientRect();
			const m = document.getElementById(` + jsString(mark) + `).getBoundingClientRect();
			return String(m.width > 0 && m.left >= c.left && m.right <= c.right); })()`
		if got := eval(inside); got != "true" {
			t.Errorf("%s: the mark #%s is not within its card #%s", what, mark, card)
		}
	}
	fits("shadow plan's user", "limit-shadow", "slots-card")
	shot("admin-shadow-plan.png")
	step("narrow the window", chromedp.EmulateViewport(420, 1000))
	fits("shadow plan's user, 420 px wide", "limit-shadow", "slots-card")
	shot("admin-shadow-plan-narrow.png")
	step("widen the window again", chromedp.EmulateViewport(1280, 1000))

	// A pool in shadow mode (provider: openai capped at 1, enforce:
	// false): its key holds 2 of 1, marked beside the cap.
	for i := range 2 {
		if status := acquire(httpapi.AcquireRequest{UserID: "page-provider-" + randomID(), Plan: "long", Pools: map[string]string{"provider": "openai"}}); status != http.StatusOK {
			t.Fatalf("stream %d joining provider=openai (1, shadow mode): got %d, want 200", i+1, status)
		}
	}
	step("look up the key of a pool in shadow mode",
		chromedp.SetValue(chromedp.ID("pool"), "provider"),
		chromedp.SetValue(chromedp.ID("pool-key"), "openai"),
		chromedp.Click(chromedp.ID("pool-lookup")),
	)
	poll("the shadow pool's key is shown", `!document.getElementById("pool-card").hidden && document.getElementById("pool-name").textContent === "provider=openai"`+
		` && document.getElementById("pool-used").textContent === "2"`)
	wantText("shadow pool key's summary", "#pool-card .summary", "2 live memberships", "the pool's cap: 1", "shadow — not enforced", "over the cap, not enforced")
	if got := eval(`document.getElementById("pool-shadow").title`); !strings.Contains(got, "Pool provider is in shadow mode") {
		t.Errorf("shadow pool mark's tooltip: got %q, want it to name pool provider in shadow mode", got)
	}
	fits("shadow pool's key", "pool-shadow", "pool-card")
	shot("admin-shadow-pool.png")

	// A user who holds nothing and waits for nothing: the empty tables
	// say so, and the page says why it shows no limit.
	step("look up a user with no slots",
		chromedp.SetValue(chromedp.ID("user"), "page-empty-"+randomID()),
		chromedp.Click(chromedp.ID("lookup")),
	)
	poll("the empty user is shown", `!document.getElementById("slots-card").hidden && document.getElementById("used").textContent === "0" && !document.getElementById("no-slots").hidden`)
	wantText("no slots held", "#no-slots", "No slots held.")
	wantText("nobody waiting", "#no-queue", "Nobody waiting.")
	wantText("empty user's summary", "#slots-card .summary", "0 live slots")
	wantText("empty user's limit", "#limit-note", "No limit to show: the limit is the plan's of each acquire")
	if visible("slots") || visible("queue") || visible("used-of") || visible("limit-shadow") {
		t.Errorf("empty user: slots table %v, queue table %v, limit %v, shadow mark %v; want none shown",
			visible("slots"), visible("queue"), visible("used-of"), visible("limit-shadow"))
	}
	shot("admin-empty-user.png")

	step("sign out, then in as a viewer, who may not release",
		chromedp.Click(chromedp.ID("sign-out")),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), e2eViewerToken),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("app")),
		chromedp.SetValue(chromedp.ID("user"), user),
		chromedp.Click(chromedp.ID("lookup")),
		chromedp.WaitVisible(chromedp.ID("release-note")),
	)
	step("look up the pool key as a viewer",
		chromedp.SetValue(chromedp.ID("pool"), "model"),
		chromedp.SetValue(chromedp.ID("pool-key"), browserLlama),
		chromedp.Click(chromedp.ID("pool-lookup")),
		chromedp.WaitVisible(chromedp.ID("pool-note")),
	)
	for _, button := range []string{"release", "set-override", "set-pool-override"} {
		if got := eval(`String(document.getElementById("` + button + `").disabled)`); got != "true" {
			t.Errorf("%s button for a viewer: disabled %s, want true", button, got)
		}
	}

	// The look-ups of "a b", region=eu and model=gpt 4o are answered 400
	// and 422 by design; Chromium logs that.
	consoleErrors := slices.DeleteFunc(browser.ConsoleErrors(), func(m string) bool {
		return strings.Contains(m, "Failed to load resource: the server responded with a status of 400") ||
			strings.Contains(m, "Failed to load resource: the server responded with a status of 422")
	})
	if len(consoleErrors) > 0 {
		t.Errorf("console errors (a CSP violation is one):\n%s", strings.Join(consoleErrors, "\n"))
	}
}

// browserLlama is a model's name that holds a '/': a key of the pool
// model, capped at 2 by browserPools.
const browserLlama = "meta-llama/Llama-3.1-70B-Instruct"

// browserPools are the pools the browser test looks up: model, and
// provider in shadow mode (enforce: false), its key openai capped at 1.
const browserPools = `pools:
  static:
    - pool: model
      maxConcurrentStreams: 5
      keys: {"meta-llama/Llama-3.1-70B-Instruct": 2}
      maxWait: 30s
    - pool: provider
      keys: {openai: 1}
      enforce: false
`

// browserShadowTiers is the plan trial, 1 stream, in shadow mode
// (enforce: false): the browser test's beside adminTiers.
const browserShadowTiers = `    - plan: trial
      maxConcurrentStreams: 1
      slotTTL: 120s
      heartbeatInterval: 20s
      enforce: false
`

// startBrowserServer is startAdminServer (on the shared standalone Redis)
// with browserShadowTiers beside adminTiers.
func startBrowserServer(t *testing.T, extra ...string) *adminServer {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "admin-tokens")
	content := "# e2e\nvic viewer " + e2eViewerToken + "\nopal operator " + e2eOperatorToken + "\n"
	if err := os.WriteFile(tokens, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	config := serveConfig([]string{testenv.Redis(t)}, "e2e-admin-"+randomID()+":", adminTiers+browserShadowTiers) +
		"admin:\n  tokensFile: " + tokens + "\n" + strings.Join(extra, "")
	proc := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	return &adminServer{Process: proc, tokensFile: tokens}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
