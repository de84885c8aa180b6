package limiter

// WrappedCalls returns how many Redis calls of l have run in a goroutine
// of their own (see deadlineClient), for the benchmarks.
func WrappedCalls(l *Limiter) int64 { return l.goCalls.Load() }
