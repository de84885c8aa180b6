package limiter

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// wakeBus carries wake-ups between the servers whose acquires wait in one
// user's queue. A release (or a prune, or support releasing the user's
// slots) publishes the stream ids of the tickets now owed a slot on the
// user's channel, and the servers holding them try at once instead of at
// their next poll. A wake-up may be lost: it only hastens what the poll
// does anyway.
type wakeBus interface {
	// subscribe calls wake with the ticket ids of each wake-up published
	// on channel (one a line; "" when any waiter of the scope should
	// look), and with "" when the subscription was interrupted (messages
	// may have been missed), until the returned stop is called; stop
	// returns once wake will not be called again. wake must not block.
	subscribe(channel string, wake func(ids string)) (stop func())
	// publish sends ids on channel. Best effort: a lost wake-up delays
	// the waiters to their next poll.
	publish(ctx context.Context, channel, ids string)
}

// wake publishes ids (the tickets owed a slot; none: any waiter) on the
// wake channel of key, a user's or a pool key's slots. The ids go one a
// line: a pool key's ticket ids hold a space ("<stream> <user>"), and no
// id holds a line break.
func (l *Limiter) wake(ctx context.Context, key string, ids ...string) {
	l.bus.publish(ctx, keys.WakeChannel(key), strings.Join(ids, "\n"))
}

// shardBus is the wakeBus on Redis: sharded pub/sub (SPUBLISH,
// SSUBSCRIBE), so a wake-up travels through the shard that holds the
// user's keys and only its subscribers, on Redis Cluster as on one
// server. A process subscribes once per user it has waiters of, whatever
// their number, over the connection rueidis already keeps to the shard
// (RESP3 carries the messages on it).
type shardBus struct {
	client func() (rueidis.Client, error)
	do     func(ctx context.Context, op string, fn func(context.Context, rueidis.Client) error) error

	mu       sync.Mutex
	subs     map[string]*shardSub     // by channel
	stopping map[string]chan struct{} // channels being unsubscribed: closed when done
}

// shardSub is one channel's subscription and its listeners.
type shardSub struct {
	listeners map[int]func(string)
	next      int
	cancel    context.CancelFunc
	done      chan struct{}
}

// newShardBus returns a shardBus on the Redis client of l.
func newShardBus(l *Limiter) *shardBus {
	return &shardBus{client: l.client, do: l.do, subs: map[string]*shardSub{}, stopping: map[string]chan struct{}{}}
}

func (b *shardBus) publish(ctx context.Context, channel, ids string) {
	_ = b.do(ctx, "wake", func(ctx context.Context, c rueidis.Client) error {
		return c.Do(ctx, c.B().Spublish().Channel(channel).Message(ids).Build()).Error()
	})
}

func (b *shardBus) subscribe(channel string, wake func(string)) func() {
	b.mu.Lock()
	for {
		done, ok := b.stopping[channel]
		if !ok {
			break
		}
		// Its SUNSUBSCRIBE would end a subscription made now.
		b.mu.Unlock()
		<-done
		b.mu.Lock()
	}
	sub := b.subs[channel]
	if sub == nil {
		ctx, cancel := context.WithCancel(context.Background())
		sub = &shardSub{listeners: map[int]func(string){}, cancel: cancel, done: make(chan struct{})}
		b.subs[channel] = sub
		go b.receive(ctx, channel, sub)
	}
	id := sub.next
	sub.next++
	sub.listeners[id] = wake
	b.mu.Unlock()
	return func() { b.unsubscribe(channel, sub, id) }
}

// unsubscribe drops listener id of sub; the last one ends the
// subscription, on the server too.
func (b *shardBus) unsubscribe(channel string, sub *shardSub, id int) {
	b.mu.Lock()
	delete(sub.listeners, id)
	if len(sub.listeners) > 0 {
		b.mu.Unlock()
		return
	}
	delete(b.subs, channel)
	stopped := make(chan struct{})
	b.stopping[channel] = stopped
	b.mu.Unlock()

	// Receive returns once the server confirms the SUNSUBSCRIBE; the
	// cancel covers a connection that never answers it.
	if c, err := b.client(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), unsubscribeTimeout)
		_ = c.Do(ctx, c.B().Sunsubscribe().Channel(channel).Build()).Error()
		cancel()
	}
	sub.cancel()
	<-sub.done

	b.mu.Lock()
	delete(b.stopping, channel)
	b.mu.Unlock()
	close(stopped)
}

// unsubscribeTimeout bounds the SUNSUBSCRIBE of a channel no waiter of
// the process needs any more.
const unsubscribeTimeout = time.Second

// receive keeps sub subscribed to channel until ctx ends. A subscription
// that ends while wanted (the connection dropped, a failover moved the
// hash slot and Redis unsubscribed it) is made again, after telling the
// listeners to look: wake-ups may have been missed meanwhile.
func (b *shardBus) receive(ctx context.Context, channel string, sub *shardSub) {
	defer close(sub.done)
	deliver := func(ids string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, wake := range sub.listeners {
			wake(ids)
		}
	}
	// Once subscribed, the listeners look: a wake-up published before
	// then was missed.
	subscribed := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "ssubscribe" {
			deliver("")
		}
	})
	backoff := resubscribeMin
	for {
		var err error
		if c, cerr := b.client(); cerr != nil {
			err = cerr
		} else {
			err = c.Receive(subscribed, c.B().Ssubscribe().Channel(channel).Build(), func(m rueidis.PubSubMessage) {
				backoff = resubscribeMin
				deliver(m.Message)
			})
		}
		if ctx.Err() != nil {
			return
		}
		deliver("")
		if err == nil {
			backoff = resubscribeMin // unsubscribed by the server: at once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, resubscribeMax)
	}
}

// Bounds of the delay before subscribing again after a failure.
const (
	resubscribeMin = 20 * time.Millisecond
	resubscribeMax = time.Second
)
