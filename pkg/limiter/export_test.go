package limiter

import "github.com/redis/rueidis"

// WrappedCalls returns how many Redis calls of l have run in a goroutine
// of their own (see deadlineClient), for the benchmarks.
func WrappedCalls(l *Limiter) int64 { return l.goCalls.Load() }

// NopObserver is the observer a limiter has when given none, for tests
// to embed in one that counts what they need.
var NopObserver Observer = nopObserver{}

// PipelineGroups returns how l's client splits cmds, one pipeline, into
// the commands of each node where it bounds the call itself (see
// deadlineClient.byNode): indexes into cmds.
func PipelineGroups(l *Limiter, cmds ...rueidis.Completed) ([][]int, error) {
	c, err := l.client()
	if err != nil {
		return nil, err
	}
	return c.(deadlineClient).byNode(cmds), nil
}
