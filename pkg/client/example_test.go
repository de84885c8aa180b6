package client_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/joishi/limiter/pkg/client"
)

func Example() {
	ctx := context.Background()
	limits, err := client.New("http://limiter.default.svc:8080")
	if err != nil {
		log.Fatal(err)
	}
	defer limits.Close(ctx) // releases whatever is still held

	lease, err := limits.Acquire(ctx, "user-42", "paid")
	var limitErr *client.Error
	if errors.As(err, &limitErr) && client.IsLimited(err) {
		log.Printf("%d of %d streams in use; retry in %s", limitErr.Used, limitErr.Limit, limitErr.RetryAfter)
		return
	} else if err != nil {
		log.Fatal(err) // or stream anyway: the limiter is an abuse control
	}
	defer lease.Release(ctx)

	stream, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lease.Lost(): // released by support, or expired: stop streaming
			cancel()
		case <-stream.Done():
		}
	}()
	_ = stream // ... stream the model's answer under this context ...
}

// A caller that would rather wait a few seconds than handle a 429 and
// poll: the acquire takes a place in the user's queue and gets the first
// slot that frees up, in turn, or ErrLimitReached when the wait (capped
// by the plan's maxWait) runs out.
func ExampleClient_AcquireWait() {
	ctx := context.Background()
	limits, err := client.New("http://limiter.default.svc:8080")
	if err != nil {
		log.Fatal(err)
	}
	defer limits.Close(ctx)

	lease, err := limits.AcquireWait(ctx, "user-42", "paid", 10*time.Second)
	var limitErr *client.Error
	if errors.As(err, &limitErr) && client.IsLimited(err) {
		log.Printf("no slot freed up within %s; retry in %s", limitErr.Waited, limitErr.RetryAfter)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	log.Printf("granted after waiting %s", lease.Waited())
}
