// Package browsertest starts a headless Chromium for the tests of a web
// page: the one the environment names (testenv.Chromium, required when
// the test command says so), with a profile of the test's own, stopped at
// the test's end, and the errors the page raises collected.
package browsertest

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/joishi/limiter/internal/testenv"
)

// Browser is a started Chromium: Ctx drives its first tab.
type Browser struct {
	Ctx context.Context

	mu     sync.Mutex
	errors []string
}

// Start starts Chromium headless, with opts after the defaults (a window
// size, say), and stops it when t ends.
func Start(t testing.TB, opts ...chromedp.ExecAllocatorOption) *Browser {
	t.Helper()
	chromium := testenv.Chromium(t)
	all := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")),
	}, opts...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), all...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // starts the browser, with no deadline of its own
		t.Fatalf("starting %s: %v", chromium, err)
	}
	b := &Browser{Ctx: ctx}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.mu.Lock()
				b.errors = append(b.errors, m.String())
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// ConsoleErrors returns the errors and uncaught exceptions the page has
// logged so far.
func (b *Browser) ConsoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.errors)
}
