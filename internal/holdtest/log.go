package holdtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"sync"
	"testing"
)

// LogBuffer collects a front end's JSON log (the proxy's, the ext_proc
// server's): give it to slog.NewJSONHandler.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Granted returns the would_refuse of each "stream granted" line by
// stream id ("" when the line has none); a would_refuse logged empty
// fails the test.
func (b *LogBuffer) Granted(t *testing.T) map[string]string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var line struct {
			Msg         string  `json:"msg"`
			StreamID    string  `json:"stream_id"`
			WouldRefuse *string `json:"would_refuse"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Bytes(), err)
		}
		if line.Msg != "stream granted" {
			continue
		}
		out[line.StreamID] = ""
		if line.WouldRefuse != nil {
			if *line.WouldRefuse == "" {
				t.Errorf("stream %s: would_refuse logged empty; want it absent unless a shadow scope would have refused", line.StreamID)
			}
			out[line.StreamID] = *line.WouldRefuse
		}
	}
	return out
}

// String returns the log as written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
