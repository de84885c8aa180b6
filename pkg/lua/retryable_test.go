package lua_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// sent records, of each command a client is given, what rueidis and
// Retryable make of it, before it is sent (rueidis recycles a command once
// answered).
type sent struct {
	rueidis.Client
	cmds []sentCmd
}

type sentCmd struct {
	name            string
	retried         bool // rueidis sends it again after a connection error
	retryable       bool // Retryable's answer
	copyIsRetryable bool // whether the copy Retryable returns is retried
}

func (s *sent) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	retry, ok := lua.Retryable(cmd)
	s.cmds = append(s.cmds, sentCmd{name: cmd.Commands()[0], retried: cmd.IsRetryable(), retryable: ok, copyIsRetryable: retry.IsRetryable()})
	return s.Client.Do(ctx, cmd)
}

// TestScriptCallsAreSentOnceAndRetryableSaysWhichMayBeRetried: a script's
// call is built as rueidis does not send it again, so that a first try
// reaches Redis once; Retryable marks the copy rueidis retries for the
// scripts whose second run answers as the first (acquire), and not for
// the others (release: a second run would answer "not held").
func TestScriptCallsAreSentOnceAndRetryableSaysWhichMayBeRetried(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := fmt.Sprintf("retryable:{user-%d}", time.Now().UnixNano())
		for _, call := range []struct {
			name      string
			run       func(c rueidis.Client) error
			retryable bool
		}{
			{"acquire", func(c rueidis.Client) error {
				_, err := lua.Acquire(ctx, c, key, "s1", 3, time.Minute, lua.Record{Plan: "three"}, false)
				return err
			}, true},
			{"release", func(c rueidis.Client) error {
				_, err := lua.Release(ctx, c, "", key, "s1")
				return err
			}, false},
		} {
			s := &sent{Client: c}
			if err := call.run(s); err != nil {
				t.Fatalf("%s: %v", call.name, err)
			}
			if len(s.cmds) == 0 {
				t.Fatalf("%s sent no command", call.name)
			}
			cmd := s.cmds[len(s.cmds)-1]
			if cmd.retried {
				t.Errorf("%s: %s is sent retryable; want it sent once", call.name, cmd.name)
			}
			if cmd.retryable != call.retryable || cmd.copyIsRetryable != call.retryable {
				t.Errorf("%s: Retryable = %v (its copy retryable: %v), want %v", call.name, cmd.retryable, cmd.copyIsRetryable, call.retryable)
			}
		}
	})
}
