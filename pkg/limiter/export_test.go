package limiter

import "github.com/redis/rueidis"

// WrappedCalls returns how many Redis calls of l have run in a goroutine
// of their own (see deadlineClient), for the benchmarks.
func WrappedCalls(l *Limiter) int64 { return l.goCalls.Load() }

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
