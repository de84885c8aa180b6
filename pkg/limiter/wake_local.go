package limiter

import (
	"context"
	"sync"
)

// localBus is the wakeBus of the embedded store, which has no sharded
// pub/sub: its one process holds every waiter, so a wake-up is a call.
type localBus struct {
	mu        sync.Mutex
	listeners map[string]map[int]func(string)
	next      int
}

func newLocalBus() *localBus { return &localBus{listeners: map[string]map[int]func(string){}} }

func (b *localBus) subscribe(channel string, wake func(string)) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.listeners[channel]
	if set == nil {
		set = map[int]func(string){}
		b.listeners[channel] = set
	}
	id := b.next
	b.next++
	set[id] = wake
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(set, id)
		if len(b.listeners[channel]) == 0 {
			delete(b.listeners, channel)
		}
	}
}

func (b *localBus) publish(_ context.Context, channel, ids string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, wake := range b.listeners[channel] {
		wake(ids)
	}
}
