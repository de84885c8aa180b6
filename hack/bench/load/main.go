// Load is the HTTP load generator of hack/bench.sh (BENCHMARKS.md): the
// same client for `limiter serve` and for the trivial handler it is
// compared with (hack/bench/trivial). Each of -conns workers, over its own
// share of -conns kept-alive connections, sends pairs: POST
// /v1/slots/acquire for a random user of -users with a stream id of its
// own, then, when granted (200), POST /v1/slots/release of that slot; a
// 429 is a denial and ends the pair. With -token every request carries
// it as a bearer token (the caller of serve's api.tokensFile).
//
// Closed loop (-rate 0): every worker sends its next pair as soon as the
// last one is answered; the figure is the most pairs/s the target serves.
// Paced (-rate R): pair k is due at start + k/R, whatever became of the
// ones before (open loop), and a worker that takes it late still counts
// its latency from when it was due, so queueing is not hidden.
//
// With -sse a pair is one stream instead, as an OpenAI SDK's client
// sends it: POST /v1/chat/completions with a chat request whose model is
// -model, the user (a random one of -users) and -plan in the X-User-Id and
// X-Plan headers, read to its end; a target answers it with Server-Sent
// Events (limiter proxy, or a plain reverse proxy, in front of
// hack/bench/sse's upstream). It prints streams/s and first-chunk-p50-us
// and first-chunk-p99-us (the time to the stream's first line) for
// pairs/s and the acquire's latency, and any answer but 200 fails the run.
//
// -url and -pid may name several targets, comma separated, to compare
// them: after -warmup of each, they take turns in -slices slices each of
// -duration / -slices (in the order A B B A A B ...), each slice led in by
// 100 ms that are not counted. The other work on a shared machine comes
// and goes over seconds; sliced, it falls on every target alike instead
// of on whichever ran while it lasted.
//
// It prints one line of name=value fields per target, in the order of
// -url: pairs/s, granted/pair, acquire-p50-us and acquire-p99-us (latency
// of the acquire request), load-cpu-us/pair (this process) and, with
// -pid, server-cpu-us/pair (that process, from /proc/PID/stat). Any other
// answer than 200 or 429, an acquire answered degraded (not counted in
// Redis) or a transport error fails the run.
//
//	go run ./hack/bench/load -url http://127.0.0.1:8080 -pid 1234 [-token TOKEN]
//	go run ./hack/bench/load -url http://A,http://B -pid 1234,1235 -slices 6
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// options are the flags.
type options struct {
	urls     []string
	pids     []int // one per URL, 0: none
	conns    int
	warmup   time.Duration
	duration time.Duration
	slices   int
	rate     float64
	plan     string
	users    int
	token    string
	sse      bool
	model    string
}

// sliceLeadIn starts every slice unmeasured, so that it is measured with
// every worker busy.
const sliceLeadIn = 100 * time.Millisecond

func run() error {
	var o options
	var urls, pids string
	flag.StringVar(&urls, "url", "", "base URL of the target, http://host:port, or several, comma separated (required)")
	flag.IntVar(&o.conns, "conns", 50, "concurrent workers, each on a kept-alive connection")
	flag.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "load sent to each target before measuring")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "how long to measure each target")
	flag.IntVar(&o.slices, "slices", 1, "turns each target takes, in slices of -duration / -slices")
	flag.Float64Var(&o.rate, "rate", 0, "pairs per second to send, paced; 0: as fast as answered")
	flag.StringVar(&pids, "pid", "", "process whose CPU time per pair to report (the server), one per -url, comma separated; empty: none")
	flag.StringVar(&o.plan, "plan", "three", "plan of every acquire")
	flag.IntVar(&o.users, "users", 1_000_000, "size of the random user pool")
	flag.StringVar(&o.token, "token", "", "bearer token every request carries; empty: none")
	flag.BoolVar(&o.sse, "sse", false, "send streams (POST /v1/chat/completions, read to the end) instead of acquire+release pairs")
	flag.StringVar(&o.model, "model", "gpt-4o", "with -sse: the model of every chat request")
	flag.Parse()
	if urls != "" {
		o.urls = strings.Split(urls, ",")
	}
	o.pids = make([]int, len(o.urls))
	if pids != "" {
		list := strings.Split(pids, ",")
		if len(list) != len(o.urls) {
			return fmt.Errorf("-pid names %d processes for %d URLs: give one per -url", len(list), len(o.urls))
		}
		for i, pid := range list {
			n, err := strconv.Atoi(pid)
			if err != nil || n < 0 {
				return fmt.Errorf("-pid: %q is not a process id", pid)
			}
			o.pids[i] = n
		}
	}
	switch {
	case len(o.urls) == 0 || slices.Contains(o.urls, ""):
		return errors.New("-url is required: one URL or several, comma separated")
	case o.conns < 1:
		return fmt.Errorf("-conns must be >= 1, got %d", o.conns)
	case o.duration <= 0:
		return fmt.Errorf("-duration must be > 0, got %s", o.duration)
	case o.slices < 1:
		return fmt.Errorf("-slices must be >= 1, got %d", o.slices)
	case o.rate < 0:
		return fmt.Errorf("-rate must be >= 0, got %g", o.rate)
	case o.users < 1:
		return fmt.Errorf("-users must be >= 1, got %d", o.users)
	case o.sse && o.model == "":
		return errors.New("-model must not be empty with -sse")
	}
	lines, err := measure(o)
	if err != nil {
		return err
	}
	for _, line := range lines {
		fmt.Println(line)
	}
	return nil
}

// window is the measured part of a run: what started (closed loop) or was
// due (paced) in it counts.
type window struct{ start, end time.Time }

func (w window) holds(t time.Time) bool { return !t.Before(w.start) && t.Before(w.end) }

// tally is one target's count of its pairs in its measured windows.
type tally struct {
	seconds        float64
	pairs, granted int
	acquireUs      []float64
	self, server   time.Duration // CPU time of this process and the target's
}

func measure(o options) ([]string, error) {
	targets := make([]*target, len(o.urls))
	for i, url := range o.urls {
		if _, err := processCPU(o.pids[i]); err != nil {
			return nil, err
		}
		targets[i] = newTarget(o, url, o.pids[i])
		defer targets[i].close()
	}
	var buf [6]byte
	_, _ = rand.Read(buf[:])
	run := "load-" + hex.EncodeToString(buf[:])

	for _, t := range targets {
		if err := t.send(run, 0, o.warmup, nil); err != nil {
			return nil, err
		}
	}
	tallies := make([]tally, len(targets))
	slice := o.duration / time.Duration(o.slices)
	for turn := range o.slices * len(targets) {
		// A B, B A, A B, ...: each target as often first as last.
		i := turn % len(targets)
		if turn/len(targets)%2 == 1 {
			i = len(targets) - 1 - i
		}
		if err := targets[i].send(run, sliceLeadIn, slice, &tallies[i]); err != nil {
			return nil, err
		}
	}
	lines := make([]string, len(targets))
	for i := range targets {
		line, err := report(o, o.pids[i], tallies[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.urls[i], err)
		}
		lines[i] = line
	}
	return lines, nil
}

// send sends pairs to t for lead + measure, counting into into (when not
// nil) the pairs that started (closed loop) or were due (paced) in the
// measure part, and the CPU time used in it.
func (t *target) send(run string, lead, measure time.Duration, into *tally) error {
	o := t.o
	start := time.Now()
	w := window{start: start.Add(lead), end: start.Add(lead + measure)}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var readings [2]cpuReading
	var cpuErr error
	cpuDone := make(chan struct{})
	go func() {
		defer close(cpuDone)
		readings, cpuErr = readWindowCPU(ctx, w, t.pid)
	}()

	var next atomic.Int64 // paced: the next pair due
	interval := time.Duration(0)
	if o.rate > 0 {
		interval = time.Duration(float64(time.Second) / o.rate)
	}
	workers := make([]tally, o.conns)
	var wg sync.WaitGroup
	for i := range o.conns {
		wg.Go(func() {
			p := t.pairer(run, i)
			for ctx.Err() == nil {
				due := time.Now()
				if interval > 0 {
					due = start.Add(time.Duration(next.Add(1)-1) * interval)
					if !due.Before(w.end) {
						return
					}
					time.Sleep(time.Until(due))
				} else if !due.Before(w.end) {
					return
				}
				granted, acquired, err := p.pair(ctx)
				if err != nil {
					cancel(err)
					return
				}
				if w.holds(due) {
					workers[i].pairs++
					if granted {
						workers[i].granted++
					}
					workers[i].acquireUs = append(workers[i].acquireUs, float64(acquired.Sub(due).Microseconds()))
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("%s: %w", t.url, err)
	}
	<-cpuDone
	if cpuErr != nil {
		return cpuErr
	}
	if into != nil {
		into.seconds += w.end.Sub(w.start).Seconds()
		for _, w := range workers {
			into.pairs += w.pairs
			into.granted += w.granted
			into.acquireUs = append(into.acquireUs, w.acquireUs...)
		}
		into.self += readings[1].self - readings[0].self
		into.server += readings[1].server - readings[0].server
	}
	return nil
}

func report(o options, pid int, t tally) (string, error) {
	if t.pairs == 0 {
		return "", errors.New("no pair was sent in the measured window")
	}
	lat := t.acquireUs
	slices.Sort(lat)
	// A stream is answered from its first chunk: its "acquire".
	pair, acquire := "pair", "acquire"
	if o.sse {
		pair, acquire = "stream", "first-chunk"
	}
	out := fmt.Sprintf("%[1]ss/s=%.1[3]f granted/%[1]s=%.4[4]f %[2]s-p50-us=%.0[5]f %[2]s-p99-us=%.0[6]f load-cpu-us/%[1]s=%.2[7]f",
		pair, acquire, float64(t.pairs)/t.seconds, float64(t.granted)/float64(t.pairs), percentile(lat, 0.50), percentile(lat, 0.99),
		float64(t.self.Microseconds())/float64(t.pairs))
	if pid != 0 {
		out += fmt.Sprintf(" server-cpu-us/%s=%.2f", pair, float64(t.server.Microseconds())/float64(t.pairs))
	}
	if o.rate > 0 {
		out += fmt.Sprintf(" offered-%ss/s=%.1f", pair, o.rate)
	}
	return out + fmt.Sprintf(" %ss=%d", pair, t.pairs), nil
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, q float64) float64 {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// newClient returns a client keeping up to conns connections alive to one
// host.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
		IdleConnTimeout: time.Minute, DisableCompression: true,
	}, Timeout: 30 * time.Second}
}
