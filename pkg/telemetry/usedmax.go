package telemetry

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultUsedMaxWindow is the window of limiter_slots_used_max.
const DefaultUsedMaxWindow = time.Minute

// usedMaxSteps is how many steps a window is kept in: the gauge reports
// the largest value of the current step and the steps before it, between
// (steps-1)/steps of a window and a whole one.
const usedMaxSteps = 6

// usedMax keeps, for each plan, the largest number of live slots one user
// of the plan was seen holding over a sliding window (limiter_slots_used_max).
// Recording is one or two atomic operations on the request path; nothing
// is kept per user. The pool metrics keep theirs by pool name, in
// instances of their own (limiter_pool_used_max, limiter_pool_fill_max):
// nothing is kept per pool key.
type usedMax struct {
	step  time.Duration
	now   func() time.Time
	plans sync.Map // plan → *planMax
}

// planMax is one plan's steps: each the step's number (its start since
// the epoch, in steps) in the high 32 bits and its largest value in the
// low 32.
type planMax struct {
	steps [usedMaxSteps]atomic.Uint64
}

func newUsedMax(window time.Duration, now func() time.Time) *usedMax {
	if window <= 0 {
		window = DefaultUsedMaxWindow
	}
	step := window / usedMaxSteps
	if step <= 0 {
		step = 1
	}
	return &usedMax{step: step, now: now}
}

// stepOf numbers the step t falls in. It wraps after 2^32 steps: of a
// minute's window, centuries.
func (m *usedMax) stepOf(t time.Time) uint32 { return uint32(t.UnixNano() / int64(m.step)) }

func (m *usedMax) plan(plan string) *planMax {
	if p, ok := m.plans.Load(plan); ok {
		return p.(*planMax)
	}
	p, _ := m.plans.LoadOrStore(plan, &planMax{})
	return p.(*planMax)
}

// record notes that a user of plan holds used live slots now.
func (m *usedMax) record(plan string, used int) {
	if used <= 0 {
		return
	}
	v := uint64(min(used, math.MaxUint32))
	step := m.stepOf(m.now())
	cell := &m.plan(plan).steps[step%usedMaxSteps]
	for {
		old := cell.Load()
		if uint32(old>>32) == step && old&math.MaxUint32 >= v {
			return
		}
		if cell.CompareAndSwap(old, uint64(step)<<32|v) {
			return
		}
	}
}

// max returns plan's largest value over the window; 0 when none was
// recorded in it.
func (m *usedMax) max(plan string) int {
	p, ok := m.plans.Load(plan)
	if !ok {
		return 0
	}
	now := m.stepOf(m.now())
	best := uint64(0)
	for i := range p.(*planMax).steps {
		cell := p.(*planMax).steps[i].Load()
		if now-uint32(cell>>32) < usedMaxSteps {
			best = max(best, cell&math.MaxUint32)
		}
	}
	return int(best)
}
