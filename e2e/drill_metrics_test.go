package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// drillJob is the job label the drill's scrapes carry, as Prometheus adds
// one to every scraped series.
const drillJob = "limiter"

// sampler scrapes the limiter_* series of its targets' /metrics once per
// tick, as Prometheus would, and keeps every sample by tick. A target whose
// scrape fails is marked stale at that tick, as Prometheus marks the
// series of a target that went away.
type sampler struct {
	mu      sync.Mutex
	targets map[string]string // instance (ops host:port) → /metrics URL
	ticks   []map[string]float64
	stale   map[int][]string // tick → series marked stale then
	last    map[string]bool  // series present at the previous tick
	stop    chan struct{}
	done    chan struct{}
	closing sync.Once
}

func startSampler(every time.Duration) *sampler {
	s := &sampler{targets: map[string]string{}, stale: map[int][]string{}, last: map[string]bool{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			s.scrapeAll()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// setTargets replaces the scraped ops listeners (base URLs).
func (s *sampler) setTargets(ops []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targets = map[string]string{}
	for _, base := range ops {
		s.targets[strings.TrimPrefix(base, "http://")] = base + "/metrics"
	}
}

// now returns the index of the next tick.
func (s *sampler) now() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ticks)
}

// close stops the scrapes; calling it again does nothing.
func (s *sampler) close() {
	s.closing.Do(func() { close(s.stop) })
	<-s.done
}

func (s *sampler) scrapeAll() {
	s.mu.Lock()
	targets := copyTargets(s.targets)
	s.mu.Unlock()
	got := map[string]float64{}
	for instance, url := range targets {
		for series, v := range scrapeLimiter(url) {
			got[withTarget(series, instance)] = v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for series := range s.last {
		if _, ok := got[series]; !ok {
			s.stale[len(s.ticks)] = append(s.stale[len(s.ticks)], series)
		}
	}
	s.last = map[string]bool{}
	for series := range got {
		s.last[series] = true
	}
	s.ticks = append(s.ticks, got)
}

func copyTargets(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// scrapeLimiter returns the limiter_* samples of one /metrics, none when it
// does not answer.
func scrapeLimiter(url string) map[string]float64 {
	out := map[string]float64{}
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	resp, err := hc.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "limiter_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); i > 0 && err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// withTarget adds the job and instance labels to a series.
func withTarget(series, instance string) string {
	target := fmt.Sprintf(`instance=%q,job=%q`, instance, drillJob)
	name, labels, ok := strings.Cut(series, "{")
	if !ok {
		return name + "{" + target + "}"
	}
	return name + "{" + strings.TrimSuffix(labels, "}") + "," + target + "}"
}

// values returns, for every series sampled, promtool's notation of its
// samples by tick: a number, "stale" at the tick it went away, "_" where
// there was none.
func (s *sampler) values() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := map[string]bool{}
	for _, tick := range s.ticks {
		for series := range tick {
			all[series] = true
		}
	}
	out := map[string]string{}
	for series := range all {
		words := make([]string, len(s.ticks))
		for i, tick := range s.ticks {
			switch v, ok := tick[series]; {
			case ok:
				words[i] = strconv.FormatFloat(v, 'g', -1, 64)
			case slices.Contains(s.stale[i], series):
				words[i] = "stale"
			default:
				words[i] = "_"
			}
		}
		out[series] = strings.Join(words, " ")
	}
	return out
}

// sum adds up, at tick i, the series of name whose labels hold every one
// of match (`plan="paid"`).
func (s *sampler) sum(i int, name string, match ...string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0.0
	for series, v := range s.ticks[i] {
		if !strings.HasPrefix(series, name+"{") {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(series, m)
		}
		if ok {
			total += v
		}
	}
	return total
}

// max is sum's maximum across series.
func (s *sampler) max(i int, name string, match ...string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	best := 0.0
	for series, v := range s.ticks[i] {
		if strings.HasPrefix(series, name+"{") && !slices.ContainsFunc(match, func(m string) bool { return !strings.Contains(series, m) }) {
			best = max(best, v)
		}
	}
	return best
}

// firing is what ALERTS{alertstate="firing"} must hold at one evaluation
// time: alert name → the plans it fires for.
type firing map[string][]string

// promtoolCheck is one expectation of the rule test: at tick at (a
// minute of the test's timeline), exactly want is firing.
type promtoolCheck struct {
	at   int
	want firing
}

// runPromtool writes a rule test of the shipped alert rules on the
// sampled series, one tick per minute, and runs promtool on it. It
// returns promtool's output and whether every check held.
func runPromtool(t *testing.T, promtool string, s *sampler, checks []promtoolCheck) (string, bool) {
	t.Helper()
	rules, err := filepath.Abs(filepath.Join("..", "config", "observability", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files:\n  - %q\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n", rules)
	values := s.values()
	names := make([]string, 0, len(values))
	for series := range values {
		names = append(names, series)
	}
	slices.Sort(names)
	for _, series := range names {
		fmt.Fprintf(&b, "      - series: '%s'\n        values: '%s'\n", series, values[series])
	}
	b.WriteString("    promql_expr_test:\n")
	for _, c := range checks {
		fmt.Fprintf(&b, "      - expr: 'ALERTS{alertstate=\"firing\"}'\n        eval_time: %dm\n        exp_samples:", c.at)
		if len(c.want) == 0 {
			b.WriteString(" []\n")
			continue
		}
		b.WriteString("\n")
		for alert, plans := range c.want {
			severity := "warning"
			for _, plan := range plans {
				fmt.Fprintf(&b, "          - labels: '{__name__=\"ALERTS\", alertname=%q, alertstate=\"firing\", job=%q, plan=%q, severity=%q}'\n            value: 1\n",
					alert, drillJob, plan, severity)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "drill-test.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if keep := os.Getenv(drillDirEnv); keep != "" {
		_ = os.WriteFile(filepath.Join(keep, "drill-test.yaml"), []byte(b.String()), 0o644)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, promtool, "test", "rules", path).CombinedOutput()
	if err != nil {
		// The samples are gone with t.TempDir(): the log keeps them, so
		// that a failure in CI can be read again.
		return string(out) + "\nthe rule test:\n" + b.String(), false
	}
	return string(out), true
}

// drillDirEnv, when set, names a directory where the drill also keeps the
// rule test it generated (t.TempDir() is removed after the test).
const drillDirEnv = "LIMITER_TEST_DRILL_DIR"
