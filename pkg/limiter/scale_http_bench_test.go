package limiter_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// scaleServe is BenchmarkScale's HTTP side: limiter serve processes of one
// deployment, sent each batch as one POST /v1/slots/heartbeats.
type scaleServe struct {
	pids   []int
	urls   []string
	prefix string // the processes' redis.keyPrefix
	auth   string // Authorization header
	client *http.Client
}

// scaleServeOf reads the serve processes given for backend be, or returns
// nil when there are none.
func scaleServeOf(b *testing.B, be limitertest.Backend) *scaleServe {
	b.Helper()
	name := envScaleServeStandalone
	if be == limitertest.RedisCluster {
		name = envScaleServeCluster
	}
	list := os.Getenv(name)
	if list == "" {
		return nil
	}
	s := &scaleServe{prefix: os.Getenv(envScalePrefix), auth: "Bearer " + os.Getenv(envScaleToken)}
	if s.prefix == "" || os.Getenv(envScaleToken) == "" {
		b.Fatalf("%s is set: %s and %s must be too", name, envScalePrefix, envScaleToken)
	}
	for entry := range strings.SplitSeq(list, ",") {
		pid, url, ok := strings.Cut(strings.TrimSpace(entry), "@")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || !strings.HasPrefix(url, "http") {
			b.Fatalf("%s=%q: want a comma list of PID@URL", name, list)
		}
		s.pids, s.urls = append(s.pids, n), append(s.urls, strings.TrimSuffix(url, "/"))
	}
	s.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	b.Cleanup(s.client.CloseIdleConnections)
	return s
}

// scaleBody is one batch's request body and its number of slots.
type scaleBody struct {
	body  []byte
	slots int
}

// bodies builds the batches' request bodies once, so a round's client work
// is writing them and scanning the answers.
func (s *scaleServe) bodies(reqs []limiter.HeartbeatRequest) []scaleBody {
	var out []scaleBody
	for from := 0; from < len(reqs); from += benchBatch {
		batch := reqs[from:min(from+benchBatch, len(reqs))]
		body := []byte(`{"slots":[`)
		for i, r := range batch {
			if i > 0 {
				body = append(body, ',')
			}
			body = fmt.Appendf(body, `{"user_id":%q,"plan":%q,"stream_id":%q}`, r.UserID, r.Plan, r.StreamID)
		}
		out = append(out, scaleBody{append(body, "]}"...), len(batch)})
	}
	return out
}

// round sends every body once, concurrency at a time, batch i to process
// i mod len(urls); every slot must come back alive and not degraded.
func (s *scaleServe) round(b *testing.B, bodies []scaleBody, concurrency int) {
	b.Helper()
	alive, degraded, failed := []byte(`"alive":true`), []byte(`"degraded":true`), []byte(`"error"`)
	var next atomic.Int64
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			var reply bytes.Buffer
			for {
				i := int(next.Add(1)) - 1
				if i >= len(bodies) || first.Load() != nil {
					return
				}
				want := bodies[i].slots
				err := s.post(s.urls[i%len(s.urls)], bodies[i].body, &reply)
				if err == nil {
					got := reply.Bytes()
					if n := bytes.Count(got, alive); n != want || bytes.Contains(got, degraded) || bytes.Contains(got, failed) {
						err = fmt.Errorf("batch %d: %d of %d slots alive, answer begins %.300s", i, n, want, got)
					}
				}
				if err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		b.Fatal(*err)
	}
}

func (s *scaleServe) post(url string, body []byte, reply *bytes.Buffer) error {
	req, err := http.NewRequest(http.MethodPost, url+httpapi.PathHeartbeats, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", s.auth)
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	reply.Reset()
	if _, err := reply.ReadFrom(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s%s answered %d: %.300s", url, httpapi.PathHeartbeats, resp.StatusCode, reply.Bytes())
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// cpu returns the CPU time (user + system) the serve processes have used.
func (s *scaleServe) cpu(b *testing.B) time.Duration {
	b.Helper()
	var total time.Duration
	for _, pid := range s.pids {
		total += procCPU(b, pid)
	}
	return total
}

// procCPU reads utime + stime of a process from /proc/PID/stat, in clock
// ticks of 10ms (USER_HZ is 100 on Linux).
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatalf("serve process %d: %v", pid, err)
	}
	// The fields after the command's closing parenthesis start at the
	// third, state; utime and stime are the 14th and 15th.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	utime, err1 := strconv.ParseInt(fields[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(fields[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
