package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// target is a server under load.
type target struct {
	o      options
	url    string
	pid    int // the server's process, whose CPU time is read; 0: none
	client *http.Client
	auth   string // the Authorization header; "" for none
}

func newTarget(o options, url string, pid int) *target {
	t := &target{o: o, url: url, pid: pid, client: newClient(o.conns)}
	if o.token != "" {
		t.auth = "Bearer " + o.token
	}
	return t
}

func (t *target) close() { t.client.CloseIdleConnections() }

// pairer sends one worker's pairs; its buffers are reused from pair to
// pair, so the load generator's own cost stays small and alike for every
// target.
type pairer struct {
	t      *target
	run    string
	worker int
	seq    int
	body   []byte
	reply  bytes.Buffer
	lines  *bufio.Reader // a stream's answer (-sse)
}

func (t *target) pairer(run string, worker int) *pairer {
	return &pairer{t: t, run: run, worker: worker}
}

// pair acquires a slot for a random user and releases it when granted. It
// returns whether it was granted and when the acquire's answer was read.
func (p *pairer) pair(ctx context.Context) (granted bool, acquired time.Time, err error) {
	if p.t.o.sse {
		return p.stream(ctx)
	}
	p.seq++
	user := p.run + "-" + strconv.Itoa(rand.IntN(p.t.o.users))
	stream := "w" + strconv.Itoa(p.worker) + "-" + strconv.Itoa(p.seq)
	p.body = append(p.body[:0], `{"user_id":"`...)
	p.body = append(p.body, user...)
	p.body = append(p.body, `","plan":"`...)
	p.body = append(p.body, p.t.o.plan...)
	p.body = append(p.body, `","stream_id":"`...)
	p.body = append(p.body, stream...)
	p.body = append(p.body, `"}`...)
	status, err := p.post(ctx, httpapi.PathAcquire)
	acquired = time.Now()
	switch {
	case err != nil:
		return false, acquired, err
	case status == http.StatusTooManyRequests:
		return false, acquired, nil
	case status != http.StatusOK:
		return false, acquired, fmt.Errorf("acquire answered %d: %s", status, p.reply.Bytes())
	case bytes.Contains(p.reply.Bytes(), []byte(`"degraded":true`)):
		return false, acquired, fmt.Errorf("acquire answered degraded (Redis not reached): %s", p.reply.Bytes())
	}
	p.body = append(p.body[:0], `{"user_id":"`...)
	p.body = append(p.body, user...)
	p.body = append(p.body, `","stream_id":"`...)
	p.body = append(p.body, stream...)
	p.body = append(p.body, `"}`...)
	if status, err := p.post(ctx, httpapi.PathRelease); err != nil {
		return true, acquired, err
	} else if status != http.StatusOK {
		return true, acquired, fmt.Errorf("release answered %d: %s", status, p.reply.Bytes())
	}
	return true, acquired, nil
}

// stream sends one chat completion request for a random user and reads
// its answer to the end. It returns when its first line was read.
func (p *pairer) stream(ctx context.Context) (granted bool, first time.Time, err error) {
	if p.body == nil {
		// A chat request as an SDK sends it: the conversation, then the model.
		p.body = []byte(`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"` +
			strings.Repeat("Tell me about streams. ", 40) + `"}],"model":` + strconv.Quote(p.t.o.model) + `,"stream":true}`)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.t.url+"/v1/chat/completions", bytes.NewReader(p.body))
	if err != nil {
		return false, first, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-Id", p.run+"-"+strconv.Itoa(rand.IntN(p.t.o.users)))
	req.Header.Set("X-Plan", p.t.o.plan)
	if p.t.auth != "" {
		req.Header.Set("Authorization", p.t.auth)
	}
	resp, err := p.t.client.Do(req)
	if err != nil {
		return false, first, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		p.reply.Reset()
		_, _ = io.Copy(&p.reply, resp.Body)
		return false, first, fmt.Errorf("stream answered %d: %s", resp.StatusCode, p.reply.Bytes())
	}
	if p.lines == nil {
		p.lines = bufio.NewReader(resp.Body)
	} else {
		p.lines.Reset(resp.Body)
	}
	if _, err := p.lines.ReadSlice('\n'); err != nil {
		return false, first, fmt.Errorf("reading the stream's first chunk: %w", err)
	}
	first = time.Now()
	if _, err := io.Copy(io.Discard, p.lines); err != nil {
		return false, first, fmt.Errorf("reading the stream: %w", err)
	}
	return true, first, nil
}

// post sends p.body to path and reads the whole answer into p.reply, so
// the connection is reused.
func (p *pairer) post(ctx context.Context, path string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.t.url+path, bytes.NewReader(p.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if p.t.auth != "" {
		req.Header.Set("Authorization", p.t.auth)
	}
	resp, err := p.t.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	p.reply.Reset()
	if _, err := io.Copy(&p.reply, resp.Body); err != nil {
		return 0, fmt.Errorf("reading the answer of %s: %w", path, err)
	}
	return resp.StatusCode, nil
}

// cpuReading is the CPU time used so far by this process and by the
// server.
type cpuReading struct{ self, server time.Duration }

// readWindowCPU reads the CPU times when w starts and when it ends.
func readWindowCPU(ctx context.Context, w window, pid int) ([2]cpuReading, error) {
	var r [2]cpuReading
	for i, at := range []time.Time{w.start, w.end} {
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		server, err := processCPU(pid)
		if err != nil {
			return r, err
		}
		r[i] = cpuReading{self: selfCPU(), server: server}
	}
	return r, nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// processCPU is the CPU time (user and system, all threads) process pid
// has used so far, from /proc/PID/stat; 0 when pid is 0.
func processCPU(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, nil
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("server CPU time: %w", err)
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from the last ')'. utime and stime are fields 14 and 15.
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("server CPU time: /proc/%d/stat has %d fields after the name, want >= 13", pid, len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("server CPU time: /proc/%d/stat: utime %q, stime %q", pid, fields[11], fields[12])
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}
