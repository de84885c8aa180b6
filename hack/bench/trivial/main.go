// Trivial is the reference the HTTP benchmark compares `limiter serve`
// with (hack/bench.sh, BENCHMARKS.md): a plain net/http handler that does
// what any service would, and no more. POST /v1/slots/acquire decodes the
// body with json.Unmarshal, runs one EVALSHA of the limiter's own acquire
// script (limit and TTL from flags) and encodes the answer;
// POST /v1/slots/release runs one EVALSHA of the release script. No
// validation, tiers, metrics, traces or deadlines.
//
//	go run ./hack/bench/trivial -redis 127.0.0.1:6379
//
// It prints "listening http://ADDR" on stdout once it accepts connections,
// and serves until SIGINT or SIGTERM.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/hack/bench/internal/listen"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/lua"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "trivial:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:0", "listen address, host:port")
	redisAddr := flag.String("redis", "", "standalone Redis address, host:port (required)")
	prefix := flag.String("key-prefix", "bench:trivial:", "prefix of every key")
	limit := flag.Int("limit", 3, "slots per user")
	ttl := flag.Duration("ttl", 120*time.Second, "slot TTL")
	flag.Parse()
	if *redisAddr == "" {
		return errors.New("-redis is required")
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{*redisAddr}, DisableCache: true})
	if err != nil {
		return err
	}
	defer c.Close()
	sources := lua.Sources()
	h := &handler{
		redis:   c,
		acquire: rueidis.NewLuaScript(sources["acquire"]),
		release: rueidis.NewLuaScript(sources["release"]),
		prefix:  *prefix,
		limit:   strconv.Itoa(*limit),
		ttl:     strconv.FormatInt(ttl.Milliseconds(), 10),
	}
	return listen.Serve(*addr, h.mux())
}

type handler struct {
	redis            rueidis.Client
	acquire, release *rueidis.Lua
	prefix           string
	limit, ttl       string
}

func (h *handler) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+httpapi.PathAcquire, h.serveAcquire)
	mux.HandleFunc("POST "+httpapi.PathRelease, h.serveRelease)
	return mux
}

func (h *handler) serveAcquire(w http.ResponseWriter, r *http.Request) {
	var req httpapi.AcquireRequest
	if !readJSON(w, r, &req) {
		return
	}
	key := h.prefix + "{" + req.UserID + "}"
	arr, err := h.acquire.Exec(r.Context(), h.redis, lua.AcquireKeys(key), []string{req.StreamID, h.limit, h.ttl}).ToArray()
	vals := make([]int64, 0, 6)
	for i := 0; err == nil && i < min(len(arr), 6); i++ {
		var v int64
		v, err = arr[i].AsInt64()
		vals = append(vals, v)
	}
	if err != nil || len(arr) != lua.AcquireReplyLen {
		http.Error(w, fmt.Sprintf("acquire script: %v %v", vals, err), http.StatusInternalServerError)
		return
	}
	if vals[0] != 1 {
		writeJSON(w, http.StatusTooManyRequests, httpapi.ErrorResponse{Error: httpapi.Error{Code: httpapi.CodeStreamLimitReached}})
		return
	}
	writeJSON(w, http.StatusOK, httpapi.AcquireResponse{Granted: true, StreamID: req.StreamID, Used: int(vals[1]),
		ExpiresAt: time.UnixMilli(vals[2]).UTC(), Pruned: int(vals[3])})
}

func (h *handler) serveRelease(w http.ResponseWriter, r *http.Request) {
	var req httpapi.ReleaseRequest
	if !readJSON(w, r, &req) {
		return
	}
	arr, err := h.release.Exec(r.Context(), h.redis, lua.ReleaseKeys(h.prefix+"{"+req.UserID+"}"), []string{req.StreamID}).ToArray()
	var released int64
	if err == nil && len(arr) == 4 {
		released, err = arr[0].AsInt64()
	}
	if err != nil || len(arr) != 4 {
		http.Error(w, fmt.Sprintf("release script: %v %v", arr, err), http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, httpapi.ReleaseResponse{Released: released == 1})
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, httpapi.MaxBodyBytes))
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
