// Load is the HTTP load generator of hack/bench.sh (BENCHMARKS.md): the
// same client for `limiter serve` and for the trivial handler it is
// compared with (hack/bench/trivial). Each of -conns workers, over its own
// share of -conns kept-alive connections, sends pairs: POST
// /v1/slots/acquire for a random user of -users with a stream id of its
// own, then, when granted (200), POST /v1/slots/release of that slot; a
// 429 is a denial and ends the pair.
//
// Closed loop (-rate 0): every worker sends its next pair as soon as the
// last one is answered; the figure is the most pairs/s the target serves.
// Paced (-rate R): pair k is due at start + k/R, whatever became of the
// ones before (open loop), and a worker that takes it late still counts
// its latency from when it was due, so queueing is not hidden.
//
// After -warmup it measures for -duration and prints one line of
// name=value fields on stdout: pairs/s, granted/pair, acquire-p50-us and
// acquire-p99-us (latency of the acquire request), load-cpu-us/pair (this
// process) and, with -pid, server-cpu-us/pair (that process, from
// /proc/PID/stat). Any other answer than 200 or 429, an acquire answered
// degraded (not counted in Redis) or a transport error fails the run.
//
//	go run ./hack/bench/load -url http://127.0.0.1:8080 -pid 1234
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
	url      string
	conns    int
	warmup   time.Duration
	duration time.Duration
	rate     float64
	pid      int
	plan     string
	users    int
}

func run() error {
	var o options
	flag.StringVar(&o.url, "url", "", "base URL of the target, http://host:port (required)")
	flag.IntVar(&o.conns, "conns", 50, "concurrent workers, each on a kept-alive connection")
	flag.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "load sent before measuring")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "how long to measure")
	flag.Float64Var(&o.rate, "rate", 0, "pairs per second to send, paced; 0: as fast as answered")
	flag.IntVar(&o.pid, "pid", 0, "process whose CPU time per pair to report (the server); 0: none")
	flag.StringVar(&o.plan, "plan", "three", "plan of every acquire")
	flag.IntVar(&o.users, "users", 1_000_000, "size of the random user pool")
	flag.Parse()
	switch {
	case o.url == "":
		return errors.New("-url is required")
	case o.conns < 1:
		return fmt.Errorf("-conns must be >= 1, got %d", o.conns)
	case o.duration <= 0:
		return fmt.Errorf("-duration must be > 0, got %s", o.duration)
	case o.rate < 0:
		return fmt.Errorf("-rate must be >= 0, got %g", o.rate)
	case o.users < 1:
		return fmt.Errorf("-users must be >= 1, got %d", o.users)
	}
	res, err := measure(o)
	if err != nil {
		return err
	}
	fmt.Println(res)
	return nil
}

// window is the measured part of a run: what started (closed loop) or was
// due (paced) in it counts.
type window struct{ start, end time.Time }

func (w window) holds(t time.Time) bool { return !t.Before(w.start) && t.Before(w.end) }

// tally is one worker's count of its pairs in the window.
type tally struct {
	pairs, granted int
	acquireUs      []float64
}

func measure(o options) (string, error) {
	t := newTarget(o)
	defer t.close()
	var buf [6]byte
	_, _ = rand.Read(buf[:])
	run := "load-" + hex.EncodeToString(buf[:])

	start := time.Now()
	w := window{start: start.Add(o.warmup), end: start.Add(o.warmup + o.duration)}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if _, err := processCPU(o.pid); err != nil {
		return "", err
	}
	var readings [2]cpuReading
	var cpuErr error
	cpuDone := make(chan struct{})
	go func() {
		defer close(cpuDone)
		readings, cpuErr = readWindowCPU(ctx, w, o.pid)
	}()

	var next atomic.Int64 // paced: the next pair due
	interval := time.Duration(0)
	if o.rate > 0 {
		interval = time.Duration(float64(time.Second) / o.rate)
	}
	tallies := make([]tally, o.conns)
	var wg sync.WaitGroup
	for i := range o.conns {
		wg.Go(func() {
			p := t.newPairer(run, i)
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
					tallies[i].pairs++
					if granted {
						tallies[i].granted++
					}
					tallies[i].acquireUs = append(tallies[i].acquireUs, float64(acquired.Sub(due).Microseconds()))
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return "", err
	}
	<-cpuDone
	if cpuErr != nil {
		return "", cpuErr
	}
	return report(o, w, tallies, readings)
}

func report(o options, w window, tallies []tally, cpu [2]cpuReading) (string, error) {
	var pairs, granted int
	var lat []float64
	for _, t := range tallies {
		pairs += t.pairs
		granted += t.granted
		lat = append(lat, t.acquireUs...)
	}
	if pairs == 0 {
		return "", errors.New("no pair was sent in the measured window")
	}
	slices.Sort(lat)
	seconds := w.end.Sub(w.start).Seconds()
	out := fmt.Sprintf("pairs/s=%.1f granted/pair=%.4f acquire-p50-us=%.0f acquire-p99-us=%.0f load-cpu-us/pair=%.2f",
		float64(pairs)/seconds, float64(granted)/float64(pairs), percentile(lat, 0.50), percentile(lat, 0.99),
		float64((cpu[1].self-cpu[0].self).Microseconds())/float64(pairs))
	if o.pid != 0 {
		out += fmt.Sprintf(" server-cpu-us/pair=%.2f", float64((cpu[1].server-cpu[0].server).Microseconds())/float64(pairs))
	}
	if o.rate > 0 {
		out += fmt.Sprintf(" offered-pairs/s=%.1f", o.rate)
	}
	return out + fmt.Sprintf(" pairs=%d", pairs), nil
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
