package cluster

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// errReadPassword wraps an error of Options.ReadPassword: the connection
// being made fails, as if Redis had refused the password.
var errReadPassword = errors.New("reading the redis password")

// credentials returns the username and the password of a new connection,
// the password read now (see Options.ReadPassword).
func (c *Client) credentials(rueidis.AuthCredentialsContext) (rueidis.AuthCredentials, error) {
	password, err := c.opts.ReadPassword()
	if err != nil {
		return rueidis.AuthCredentials{}, fmt.Errorf("%w: %w", errReadPassword, err)
	}
	return rueidis.AuthCredentials{Username: c.opts.Username, Password: password}, nil
}

// authReply reports whether a Redis error reply refuses this replica's
// credentials: a wrong password or user (WRONGPASS, as after a rotation the
// replica has not seen), or none given where one is required (NOAUTH).
func authReply(err *rueidis.RedisError) bool {
	switch replyCode(err) {
	case "WRONGPASS", "NOAUTH":
		return true
	}
	return false
}

// refusesCredentials reports whether err is a connection that could not
// authenticate: Redis refused the credentials, or the password could not be
// read.
func refusesCredentials(err error) bool {
	var rerr *rueidis.RedisError
	return errors.Is(err, errReadPassword) || errors.As(err, &rerr) && authReply(rerr)
}

// noteCredentials logs at ERROR the first failure to authenticate since
// Redis last accepted the credentials, err being a failed call or
// connection, so the cause of the outage is named once, not per call.
func (h *health) noteCredentials(err error) {
	if !refusesCredentials(err) {
		return
	}
	if h.refusedAt.Swap(time.Now().UnixNano()) == 0 {
		h.logger.Error("redis refused the credentials (authentication failed): until it accepts them every plan applies its failureMode "+
			"(Open: granting degraded, uncounted, limits not enforced; Closed: 503 limiter_unavailable); "+
			"check redis.username and the password in redis.passwordFile (read at each new connection)",
			"addrs", h.addrs, "err", err.Error())
	}
}

// noteAnswer logs at INFO that Redis accepts the credentials again, once
// it answered at now, unix nanoseconds, and refused none for DownAfter: a
// shard refusing them while others accept does not make the log flap.
func (h *health) noteAnswer(now int64) {
	if at := h.refusedAt.Load(); at != 0 && now-at >= int64(DownAfter) && h.refusedAt.CompareAndSwap(at, 0) {
		h.logger.Info("redis accepts the credentials again", "addrs", h.addrs)
	}
}

// replyCode is the first word of a Redis error reply: its code.
func replyCode(err *rueidis.RedisError) string {
	code, _, _ := strings.Cut(err.Error(), " ")
	return code
}
