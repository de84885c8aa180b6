package cluster

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
)

const (
	credentialsRefused  = `"level":"ERROR","msg":"redis refused the credentials`
	credentialsAccepted = `"level":"INFO","msg":"redis accepts the credentials again`
)

// TestHealthOfRefusedCredentials: Redis refusing the password (rotated
// without the replica knowing, or wrong from the start) is an outage: Up
// turns false and one ERROR names authentication, however many calls
// fail; once Redis accepts it again, Up turns true and one INFO says so.
func TestHealthOfRefusedCredentials(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		fromStart bool
	}{
		{"the password changes while the client runs", false},
		{"the password is wrong from the start", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartRedis(t)
			srv.SetPassword(t, "", "right-password")
			var logs testenv.Buffer
			opts := healthOptions(&logs, srv.Addr())
			opts.Password = "right-password"
			required := "right-password"
			if tc.fromStart {
				opts.Password = "wrong-password"
			}
			c := newClient(t, opts)
			if !tc.fromStart {
				if !eventually(5*time.Second, c.Up) {
					t.Fatalf("Up() stayed false for 5s with the right password:\n%s", logs.String())
				}
				srv.SetPassword(t, required, "rotated-password")
				required = "rotated-password"
			}

			if !eventually(DownAfter+3*time.Second, func() bool { return !c.Up() }) {
				t.Fatalf("Up() stayed true for %v while Redis refused the password:\n%s", DownAfter+3*time.Second, logs.String())
			}
			time.Sleep(500 * time.Millisecond) // several probes refused
			if got := strings.Count(logs.String(), credentialsRefused); got != 1 {
				t.Errorf("logged %q %d times while Redis refused the password, want once:\n%s", credentialsRefused, got, logs.String())
			}

			srv.SetPassword(t, required, opts.Password)
			if !eventually(10*time.Second, c.Up) {
				t.Fatalf("Up() stayed false for 10s once Redis accepted the password:\n%s", logs.String())
			}
			if !eventually(3*time.Second, func() bool { return strings.Contains(logs.String(), credentialsAccepted) }) {
				t.Errorf("no %q once Redis accepted the password:\n%s", credentialsAccepted, logs.String())
			}
			if got := strings.Count(logs.String(), credentialsRefused); got != 1 {
				t.Errorf("logged %q %d times, want once:\n%s", credentialsRefused, got, logs.String())
			}
		})
	}
}

// TestPasswordReadAtEachConnection: with ReadPassword, each new connection
// authenticates with what it returns then; an error fails the connection
// like a refused password.
func TestPasswordReadAtEachConnection(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	srv.SetPassword(t, "", "first-password")
	var mu sync.Mutex
	password, readErr := "first-password", error(nil)
	set := func(p string, err error) {
		mu.Lock()
		defer mu.Unlock()
		password, readErr = p, err
	}
	var logs testenv.Buffer
	opts := healthOptions(&logs, srv.Addr())
	opts.Password = "ignored"
	opts.ReadPassword = func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		return password, readErr
	}
	c := newClient(t, opts)
	if !eventually(5*time.Second, c.Up) {
		t.Fatalf("Up() stayed false for 5s with the password ReadPassword gives:\n%s", logs.String())
	}

	set("", errors.New("open /etc/limiter/redis/password: no such file or directory"))
	srv.SetPassword(t, "first-password", "second-password")
	if !eventually(DownAfter+3*time.Second, func() bool { return !c.Up() }) {
		t.Fatalf("Up() stayed true for %v while the password could not be read:\n%s", DownAfter+3*time.Second, logs.String())
	}
	if !strings.Contains(logs.String(), "no such file or directory") || strings.Count(logs.String(), credentialsRefused) != 1 {
		t.Errorf("want one %q naming the error reading the password:\n%s", credentialsRefused, logs.String())
	}

	set("second-password", nil)
	if !eventually(10*time.Second, c.Up) {
		t.Fatalf("Up() stayed false for 10s once ReadPassword gave the new password:\n%s", logs.String())
	}
}
