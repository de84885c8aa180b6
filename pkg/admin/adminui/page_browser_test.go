package adminui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/chromedp/chromedp"
	"github.com/joishi/limiter/internal/browsertest"
	"github.com/joishi/limiter/pkg/admin/adminui"
)

// These tests drive the page in headless Chromium against fakeAdmin, an
// admin API answering from memory, so that they can choose the order in
// which answers arrive. e2e/admin_browser_test.go drives it against the
// real limiter.

// fakeAdmin answers the calls the page makes. Each user holds one slot and,
// when in waiting, waits with one acquire; each pool key has one holder;
// each has an override in force. Users named "broken-..." answer 503. A
// look-up can be held back to arrive late.
type fakeAdmin struct {
	mu       sync.Mutex
	waiting  map[string]bool          // users with an acquire in their queue
	held     map[string]chan struct{} // look-ups of a user or pool=key wait until closed
	lookUps  map[string]int           // look-ups asked, by user or pool=key
	answered map[string]int           // look-ups answered, by user or pool=key
	released []string                 // users released, in order
	reasons  []string                 // the reasons of the releases, in order
}

func newFakeAdmin(waiting ...string) *fakeAdmin {
	f := &fakeAdmin{waiting: map[string]bool{}, held: map[string]chan struct{}{}, lookUps: map[string]int{}, answered: map[string]int{}}
	for _, user := range waiting {
		f.waiting[user] = true
	}
	return f
}

// hold holds back the look-ups of name (a user, or pool=key) until the
// function it returns is called; t.Cleanup calls it too.
func (f *fakeAdmin) hold(t *testing.T, name string) func() {
	gate := make(chan struct{})
	f.mu.Lock()
	f.held[name] = gate
	f.mu.Unlock()
	let := sync.OnceFunc(func() {
		f.mu.Lock()
		if f.held[name] == gate {
			delete(f.held, name)
		}
		f.mu.Unlock()
		close(gate)
	})
	t.Cleanup(let)
	return let
}

// lookUp counts a look-up of name and waits while it is held.
func (f *fakeAdmin) lookUp(r *http.Request, name string) {
	f.mu.Lock()
	f.lookUps[name]++
	gate := f.held[name]
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}
}

func (f *fakeAdmin) answer(w http.ResponseWriter, name string, status int, v any) {
	if name != "" {
		f.mu.Lock()
		f.answered[name]++
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Admin-Role", "operator")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeAdmin) count(counts map[string]int, name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return counts[name]
}

func (f *fakeAdmin) releasedUsers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.released)
}

func (f *fakeAdmin) releaseReasons() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reasons)
}

func (f *fakeAdmin) handler(t *testing.T) http.Handler {
	files, err := adminui.Files()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /admin/", http.StripPrefix("/admin/", http.FileServerFS(files)))
	mux.HandleFunc("GET /v1/admin/audit", func(w http.ResponseWriter, r *http.Request) {
		f.answer(w, "", http.StatusOK, map[string]any{"records": []any{}})
	})
	mux.HandleFunc("GET /v1/admin/users/{user}/slots", func(w http.ResponseWriter, r *http.Request) {
		user := r.PathValue("user")
		f.lookUp(r, user)
		if strings.HasPrefix(user, "broken-") {
			f.answer(w, user, http.StatusServiceUnavailable, map[string]any{"error": map[string]any{"code": "redis_unavailable", "message": "Redis did not answer"}})
			return
		}
		now := time.Now().UTC()
		queue := []any{}
		if f.waiting[user] {
			queue = append(queue, map[string]any{"place": 1, "priority": 0, "stream_id": "w-" + user, "plan": "pro",
				"waiting_since": now.Format(time.RFC3339Nano), "waited_ms": 0})
		}
		f.answer(w, user, http.StatusOK, map[string]any{"user_id": user, "used": 1, "queue": queue, "plan_limits": []any{}, "override": override(now),
			"slots": []any{map[string]any{"stream_id": "s-" + user, "expires_at": now.Add(time.Minute).Format(time.RFC3339Nano), "ttl_ms": 60000}}})
	})
	mux.HandleFunc("POST /v1/admin/users/{user}/release", func(w http.ResponseWriter, r *http.Request) {
		user := r.PathValue("user")
		var body struct{ Reason string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.released = append(f.released, user)
		f.reasons = append(f.reasons, body.Reason)
		f.mu.Unlock()
		f.answer(w, "", http.StatusOK, map[string]any{"released": []string{"s-" + user}, "audit_id": "0123456789abcdef"})
	})
	mux.HandleFunc("GET /v1/admin/pools/{pool}/keys/{key}", func(w http.ResponseWriter, r *http.Request) {
		pool, key := r.PathValue("pool"), r.PathValue("key")
		name := pool + "=" + key
		f.lookUp(r, name)
		now := time.Now().UTC()
		f.answer(w, name, http.StatusOK, map[string]any{"pool": pool, "key": key, "used": 1, "limit": 2, "enforce": true, "waiters": []any{}, "override": override(now),
			"holders": []any{map[string]any{"user_id": "u-" + key, "stream_id": "s-" + key, "expires_at": now.Add(time.Minute).Format(time.RFC3339Nano), "ttl_ms": 60000}}})
	})
	return mux
}

// override is an override in force, set at now for an hour.
func override(now time.Time) map[string]any {
	return map[string]any{"max_concurrent_streams": 3, "expires_at": now.Add(time.Hour).Format(time.RFC3339Nano), "ttl_ms": 3600000,
		"actor": "opal", "reason": "ticket 0: more for the demo"}
}

// page is the admin page open in headless Chromium on a fakeAdmin, signed
// in as an operator.
type page struct {
	ctx context.Context
}

func openPage(t *testing.T, f *fakeAdmin) *page {
	srv := httptest.NewServer(f.handler(t))
	t.Cleanup(srv.Close)
	browser := browsertest.Start(t)
	ctx := browser.Ctx
	// The page must raise no error on the way.
	t.Cleanup(func() {
		for _, e := range browser.ConsoleErrors() {
			if !strings.Contains(e, "Failed to load resource: the server responded with a status of 503") { // a broken- user's
				t.Errorf("console error: %s", e)
			}
		}
	})
	p := &page{ctx: ctx}
	p.step(t, "open the page and sign in",
		chromedp.Navigate(srv.URL+"/admin/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "operator-token-0123456789"),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("app")),
	)
	return p
}

func (p *page) step(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// poll waits until the JavaScript expr is true.
func (p *page) poll(t *testing.T, what, expr string) {
	t.Helper()
	p.step(t, what, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(15*time.Second))(ctx, tg)
		return err
	}))
}

func (p *page) eval(t *testing.T, expr string) string {
	t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return s
}

// lookUpUser asks for user, not waiting for the answer.
func (p *page) lookUpUser(t *testing.T, user string) {
	t.Helper()
	p.step(t, "look up "+user, chromedp.SetValue(chromedp.ID("user"), user), chromedp.Click(chromedp.ID("lookup")))
}

// lookUpPool asks for the key of pool, not waiting for the answer.
func (p *page) lookUpPool(t *testing.T, pool, key string) {
	t.Helper()
	p.step(t, "look up "+pool+"="+key, chromedp.SetValue(chromedp.ID("pool"), pool), chromedp.SetValue(chromedp.ID("pool-key"), key),
		chromedp.Click(chromedp.ID("pool-lookup")))
}

// showing is a JavaScript test that the user card (slots-user) or the
// pool key card (pool-name) is shown, naming name.
func showing(card, name string) string {
	return `!document.getElementById(` + strconv.Quote(card) + `).closest("section").hidden && document.getElementById(` +
		strconv.Quote(card) + `).textContent === ` + strconv.Quote(name)
}

// settle waits until f has answered n look-ups of name, then gives the
// page a moment to show the last answer.
func (p *page) settle(t *testing.T, f *fakeAdmin, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for f.count(f.answered, name) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d look-ups answered, want %d", name, f.count(f.answered, name), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.step(t, "let the page take "+name+"'s answer", chromedp.Sleep(300*time.Millisecond))
}

// TestReleaseDialogActsOnTheUserItNames: the operator looks at user A's
// card, asks for user B (whose answer is slow), and meanwhile opens A's
// "Release all slots" dialog, which names A. B's answer then arrives
// behind the modal dialog. The dialog closes, saying why, rather than
// release B with the reason written for A; opened again, it names B and
// releases B.
func TestReleaseDialogActsOnTheUserItNames(t *testing.T) {
	f := newFakeAdmin()
	p := openPage(t, f)
	p.lookUpUser(t, "user-a")
	p.poll(t, "user-a's card", showing("slots-user", "user-a")+` && !document.getElementById("release").disabled`)
	letB := f.hold(t, "user-b")
	p.lookUpUser(t, "user-b")
	p.step(t, "open the release dialog on user-a's card", chromedp.Click(chromedp.ID("release")), chromedp.WaitVisible(chromedp.ID("reason")))
	if got := p.eval(t, `document.getElementById("confirm-user").textContent`); got != "user-a" {
		t.Fatalf("the dialog names %q, want user-a", got)
	}
	p.step(t, "write a reason for user-a", chromedp.SendKeys(chromedp.ID("reason"), "ticket 1: user-a locked out"))

	letB()
	p.poll(t, "user-b's answer lands behind the dialog", showing("slots-user", "user-b"))
	if open := p.eval(t, `String(document.getElementById("confirm").open)`); open != "false" {
		named := p.eval(t, `document.getElementById("confirm-user").textContent`)
		t.Errorf("the release dialog naming %q is open on user-b's card, want it closed", named)
		p.step(t, "confirm the release it names", chromedp.Click(chromedp.ID("confirm-release")))
		p.poll(t, "the release answered", `document.getElementById("notice").textContent.startsWith("Released")`)
		if got := f.releasedUsers(); !slices.Equal(got, []string{named}) {
			t.Errorf("the dialog named %q, with the reason written for it; the page released %q", named, got)
		}
		return
	}
	if got := p.eval(t, `document.getElementById("notice").hidden ? "" : document.getElementById("notice").textContent`); !strings.Contains(got, "user-a was closed") {
		t.Errorf("notice: got %q, want it to say the dialog about user-a was closed", got)
	}
	if got := f.releasedUsers(); len(got) != 0 {
		t.Fatalf("released %q, want nothing released yet", got)
	}

	p.step(t, "open the release dialog on user-b's card", chromedp.Click(chromedp.ID("release")), chromedp.WaitVisible(chromedp.ID("reason")))
	if got := p.eval(t, `document.getElementById("confirm-user").textContent`); got != "user-b" {
		t.Fatalf("the dialog names %q, want user-b", got)
	}
	p.step(t, "release user-b",
		chromedp.SendKeys(chromedp.ID("reason"), "ticket 2: user-b locked out"),
		chromedp.Click(chromedp.ID("confirm-release")),
	)
	p.poll(t, "the release answered", `document.getElementById("notice").textContent.startsWith("Released")`)
	if got, want := f.releasedUsers(), []string{"user-b"}; !slices.Equal(got, want) {
		t.Errorf("released %q, want %q", got, want)
	}
}

// TestDialogsCloseWhenTheCardShowsAnother: a dialog opened on a card (a
// user's or a pool key's) closes when a look-up asked before it opened
// brings another user or key to that card; the dialog would name one and
// the card another.
func TestDialogsCloseWhenTheCardShowsAnother(t *testing.T) {
	f := newFakeAdmin()
	p := openPage(t, f)
	for i, tc := range []struct {
		name   string
		button string // opens the dialog
		dialog string
		named  string // the element naming what the dialog acts on
		pool   bool   // on the pool key card, else the user card
	}{
		{name: "release all slots of a user", button: "release", dialog: "confirm", named: "confirm-user"},
		{name: "override a user's limit", button: "set-override", dialog: "override-dialog", named: "override-user"},
		{name: "remove a user's override", button: "remove-override", dialog: "remove-dialog", named: "remove-user"},
		{name: "override a pool key's cap", button: "set-pool-override", dialog: "override-dialog", named: "override-user", pool: true},
		{name: "remove a pool key's override", button: "remove-pool-override", dialog: "remove-dialog", named: "remove-user", pool: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, next := "a"+strconv.Itoa(i), "b"+strconv.Itoa(i)
			card, firstName, nextName := "slots-user", first, next
			lookUp := func(name string) { p.lookUpUser(t, name) }
			if tc.pool {
				card, firstName, nextName = "pool-name", "model="+first, "model="+next
				lookUp = func(key string) { p.lookUpPool(t, "model", key) }
			}
			lookUp(first)
			p.poll(t, firstName+"'s card", showing(card, firstName)+` && !document.getElementById(`+strconv.Quote(tc.button)+`).disabled`)
			letNext := f.hold(t, nextName)
			lookUp(next)
			p.step(t, "open the dialog", chromedp.Click(chromedp.ID(tc.button)), chromedp.WaitVisible(chromedp.ID(tc.named)))
			if got := p.eval(t, `document.getElementById(`+strconv.Quote(tc.named)+`).textContent`); got != firstName {
				t.Fatalf("the dialog names %q, want %q", got, firstName)
			}
			letNext()
			p.poll(t, nextName+"'s answer lands behind the dialog", showing(card, nextName))
			if got := p.eval(t, `String(document.getElementById(`+strconv.Quote(tc.dialog)+`).open)`); got != "false" {
				t.Errorf("the dialog naming %s on %s's card: open %s, want it closed", firstName, nextName, got)
				p.step(t, "close it", chromedp.Click(chromedp.CSS("#"+tc.dialog+" button.quiet")))
			}
		})
	}
}

// TestLookUpShowsTheLatestAnswer: look-ups can be answered out of order.
// The answer to an earlier look-up, arriving after a later one's, is not
// shown: the card keeps what was asked for last.
func TestLookUpShowsTheLatestAnswer(t *testing.T) {
	f := newFakeAdmin()
	p := openPage(t, f)
	for i, tc := range []struct {
		name         string
		earlier      string // slow
		later        string
		pool         bool
		errorElement string // shown when the earlier look-up's failure is taken
	}{
		{name: "a user's answer", earlier: "slow-user", later: "fast-user"},
		{name: "a user's failure", earlier: "broken-user", later: "fast-user", errorElement: "lookup-error"},
		{name: "a pool key's answer", earlier: "slow-key", later: "fast-key", pool: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			earlier, later := tc.earlier+strconv.Itoa(i), tc.later+strconv.Itoa(i)
			card, earlierName, laterName := "slots-user", earlier, later
			lookUp := func(name string) { p.lookUpUser(t, name) }
			if tc.pool {
				card, earlierName, laterName = "pool-name", "model="+earlier, "model="+later
				lookUp = func(key string) { p.lookUpPool(t, "model", key) }
			}
			letEarlier := f.hold(t, earlierName)
			lookUp(earlier)
			lookUp(later)
			p.poll(t, "the later look-up's answer", showing(card, laterName))
			letEarlier()
			p.settle(t, f, earlierName, 1)
			if got := p.eval(t, `document.getElementById(`+strconv.Quote(card)+`).closest("section").hidden ? "(hidden)" : document.getElementById(`+strconv.Quote(card)+`).textContent`); got != laterName {
				t.Errorf("after the earlier look-up's answer: the card shows %q, want %q, the later look-up's", got, laterName)
			}
			if tc.errorElement != "" {
				if got := p.eval(t, `String(document.getElementById(`+strconv.Quote(tc.errorElement)+`).hidden)`); got != "true" {
					t.Errorf("the earlier look-up's failure is shown, want it dropped")
				}
			}
		})
	}
}

// TestReleaseLooksAgainOnlyIfNothingWasAskedSince: after releasing a user
// whose acquires wait, the page looks the user up again 500 ms later to
// show them served; if the operator has asked for another user since,
// that user stays shown, even when the answers arrive out of order.
func TestReleaseLooksAgainOnlyIfNothingWasAskedSince(t *testing.T) {
	f := newFakeAdmin("user-a")
	p := openPage(t, f)
	p.lookUpUser(t, "user-a")
	p.poll(t, "user-a's card, its acquire waiting", showing("slots-user", "user-a")+` && document.querySelectorAll("#queue tbody tr").length === 1`)
	p.step(t, "release user-a",
		chromedp.Click(chromedp.ID("release")),
		chromedp.WaitVisible(chromedp.ID("reason")),
		chromedp.SendKeys(chromedp.ID("reason"), "ticket 3: user-a locked out"),
		chromedp.Click(chromedp.ID("confirm-release")),
	)
	p.poll(t, "the release answered", `document.getElementById("notice").textContent.startsWith("Released")`)
	p.settle(t, f, "user-a", 2) // the look-up that follows the release
	// Any look-up of user-a from now on answers late; user-b's answer too,
	// until the 500 ms have passed.
	letA := f.hold(t, "user-a")
	letB := f.hold(t, "user-b")
	p.lookUpUser(t, "user-b")
	p.step(t, "wait past the look-up again", chromedp.Sleep(800*time.Millisecond))
	letB()
	p.poll(t, "user-b's card", showing("slots-user", "user-b"))
	letA()
	if n := f.count(f.lookUps, "user-a"); n > 2 {
		p.settle(t, f, "user-a", n)
	}
	if got := p.eval(t, `document.getElementById("slots-user").textContent`); got != "user-b" {
		t.Errorf("the card shows %q, want user-b, asked for after the release", got)
	}
	if got, want := f.releasedUsers(), []string{"user-a"}; !slices.Equal(got, want) {
		t.Errorf("released %q, want %q", got, want)
	}
}

// TestReleaseLooksAgainOnlyIfNothingWasAskedSinceItsLookUp: the operator
// asks for user-b while the look-up that follows user-a's release is on
// its way, and user-b's answer takes longer than the 500 ms after which
// the page would look user-a up again. That look-up again is skipped
// (another was asked for since the release's), and the card ends on
// user-b, the look-up asked for last.
func TestReleaseLooksAgainOnlyIfNothingWasAskedSinceItsLookUp(t *testing.T) {
	f := newFakeAdmin("user-a")
	p := openPage(t, f)
	p.lookUpUser(t, "user-a")
	p.poll(t, "user-a's card, its acquire waiting", showing("slots-user", "user-a")+` && document.querySelectorAll("#queue tbody tr").length === 1`)
	letA := f.hold(t, "user-a") // the look-up that follows the release waits
	p.step(t, "release user-a",
		chromedp.Click(chromedp.ID("release")),
		chromedp.WaitVisible(chromedp.ID("reason")),
		chromedp.SendKeys(chromedp.ID("reason"), "ticket 3: user-a locked out"),
		chromedp.Click(chromedp.ID("confirm-release")),
	)
	p.poll(t, "the release answered", `document.getElementById("notice").textContent.startsWith("Released")`)
	for deadline := time.Now().Add(10 * time.Second); f.count(f.lookUps, "user-a") < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the page did not look user-a up after the release within 10s")
		}
	}
	letB := f.hold(t, "user-b")
	p.lookUpUser(t, "user-b") // asked while the release's look-up is on its way
	letA()
	p.step(t, "wait past the look-up again", chromedp.Sleep(1200*time.Millisecond))
	letB()
	p.settle(t, f, "user-b", 1)
	p.step(t, "let answers land", chromedp.Sleep(500*time.Millisecond))
	if n := f.count(f.lookUps, "user-a"); n != 2 {
		t.Errorf("user-a was looked up %d times, want 2 (before the release and after it; no look-up again)", n)
	}
	if got := p.eval(t, `document.getElementById("slots-card").hidden ? "(hidden)" : document.getElementById("slots-user").textContent`); got != "user-b" {
		t.Errorf("the card shows %q, want user-b, the look-up asked for last", got)
	}
	if got, want := f.releasedUsers(), []string{"user-a"}; !slices.Equal(got, want) {
		t.Errorf("released %q, want %q", got, want)
	}
}

// TestReasonsAreCountedAsTheAPICountsThem: the API bounds a reason at 500
// characters (code points) once each run of whitespace is one space, so
// the page counts alike: 500 emoji (1,000 UTF-16 units) can be typed,
// counted 500 and sent; one more character is over the bound, and the
// dialog will not send it; a run of spaces and newlines counts one.
func TestReasonsAreCountedAsTheAPICountsThem(t *testing.T) {
	f := newFakeAdmin()
	p := openPage(t, f)
	p.lookUpUser(t, "user-a")
	p.poll(t, "user-a's card", showing("slots-user", "user-a")+` && !document.getElementById("release").disabled`)
	emoji := strings.Repeat("\U0001F600", 500)
	p.step(t, "type 500 emoji as the reason",
		chromedp.Click(chromedp.ID("release")),
		chromedp.WaitVisible(chromedp.ID("reason")),
		chromedp.SendKeys(chromedp.ID("reason"), emoji),
	)
	if got := p.eval(t, `[...document.getElementById("reason").value].length + " typed, counted " + document.getElementById("reason-count").textContent + ", release " + (document.getElementById("confirm-release").disabled ? "disabled" : "enabled")`); got != "500 typed, counted 500, release enabled" {
		t.Errorf("500 emoji: got %s; want 500 typed, counted 500, release enabled", got)
	}
	p.step(t, "type one more", chromedp.SendKeys(chromedp.ID("reason"), "x"))
	if got := p.eval(t, `document.getElementById("reason-count").textContent + ", release " + (document.getElementById("confirm-release").disabled ? "disabled" : "enabled")`); got != "501, release disabled" {
		t.Errorf("501 characters: got %s; want 501, release disabled", got)
	}
	p.step(t, "type a run of whitespace in the middle",
		chromedp.Evaluate[chromedp.Void](`(() => { const el = document.getElementById("reason"); el.value = el.value.slice(0, -1); el.value = el.value.slice(0, 2) + "  \n\t " + el.value.slice(2, -2); el.dispatchEvent(new Event("input")); })()`),
	)
	if got := p.eval(t, `document.getElementById("reason-count").textContent + ", release " + (document.getElementById("confirm-release").disabled ? "disabled" : "enabled")`); got != "500, release enabled" {
		t.Errorf("499 emoji and a run of whitespace: got %s; want 500 (the run counts one), release enabled", got)
	}
	p.step(t, "release", chromedp.Click(chromedp.ID("confirm-release")))
	p.poll(t, "the release answered", `document.getElementById("notice").textContent.startsWith("Released")`)
	want := "\U0001F600 " + strings.Repeat("\U0001F600", 498)
	if got := f.releaseReasons(); len(got) != 1 || got[0] != want {
		for _, r := range got {
			t.Errorf("reason sent: %d characters, starting %+q; want 500, starting %+q", utf8.RuneCountInString(r), r[:min(len(r), 12)], want[:12])
		}
	}

	p.step(t, "type 500 emoji as an override's reason",
		chromedp.Click(chromedp.ID("set-override")),
		chromedp.WaitVisible(chromedp.ID("override-why")),
		chromedp.SendKeys(chromedp.ID("override-why"), emoji),
	)
	if got := p.eval(t, `[...document.getElementById("override-why").value].length + " typed, set " + (document.getElementById("confirm-override").disabled ? "disabled" : "enabled")`); got != "500 typed, set enabled" {
		t.Errorf("500 emoji as an override's reason: got %s; want 500 typed, set enabled", got)
	}
}
