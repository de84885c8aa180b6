package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

var httpClient = &http.Client{Timeout: 10 * time.Second}

// call sends method to url with body (JSON-encoded unless it is a string)
// and decodes the answer into out when out is not nil. It returns the
// status and the raw answer.
func call(t testing.TB, hc *http.Client, method, url string, body, out any) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: status %d, body %q: %v", method, url, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode, resp.Header, data
}

func acquire(t testing.TB, base, user, plan string) (int, httpapi.AcquireResponse) {
	t.Helper()
	var out httpapi.AcquireResponse
	status, _, data := call(t, httpClient, "POST", base+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: plan}, nil)
	if status == http.StatusOK {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatal(err)
		}
	}
	return status, out
}

func randomID() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// serveConfig renders a limiter config for redis with the given key prefix
// and static tiers (YAML list items, indented by four spaces).
func serveConfig(redis []string, keyPrefix, tiers string) string {
	return serveConfigTimeout(redis, keyPrefix, tiers, 0)
}

// serveConfigTimeout is serveConfig with redis.timeout set to timeout (0:
// the default, 250ms).
func serveConfigTimeout(redis []string, keyPrefix, tiers string, timeout time.Duration) string {
	var setTimeout string
	if timeout > 0 {
		setTimeout = fmt.Sprintf("\n  timeout: %s", timeout)
	}
	return fmt.Sprintf(`redis:
  addrs: ["%s"]
  keyPrefix: %q%s
tiers:
  source: static
  static:
%s`, strings.Join(redis, `", "`), keyPrefix, setTimeout, tiers)
}

// incidentTiers are free=1 and paid=3 with a 2s TTL.
const incidentTiers = `    - plan: free
      maxConcurrentStreams: 1
      slotTTL: 2s
      heartbeatInterval: 500ms
    - plan: paid
      maxConcurrentStreams: 3
      slotTTL: 2s
      heartbeatInterval: 500ms
`

func startServers(t *testing.T, n int, config string) []*servetest.Process {
	t.Helper()
	procs := make([]*servetest.Process, n)
	for i := range procs {
		procs[i] = servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	}
	return procs
}

func urls(procs []*servetest.Process) []string {
	out := make([]string, len(procs))
	for i, p := range procs {
		out[i] = p.API
	}
	return out
}

// redisBackends are the Redis deployments the end-to-end tests run on.
var redisBackends = []struct {
	name  string
	redis func(t *testing.T) []string
}{
	{"standalone", func(t *testing.T) []string { return []string{testenv.Redis(t)} }},
	{"cluster", func(t *testing.T) []string { return testenv.Cluster(t) }},
}
