package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// do sends one command to the Redis server at addr over a fresh connection and
// returns its reply: string (simple or bulk), int64, []any, nil, or an error
// for a Redis error reply. The package stays free of client libraries.
func do(addr string, timeout time.Duration, args ...string) (any, error) {
	replies, err := doAll(addr, timeout, args)
	if err != nil {
		return nil, err
	}
	return replies[0], nil
}

// doAll sends commands one after the other over one fresh connection (so an
// AUTH first authenticates the rest) and returns their replies; it stops at
// the first error.
func doAll(addr string, timeout time.Duration, commands ...[]string) ([]any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	replies := make([]any, 0, len(commands))
	for _, args := range commands {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, arg := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(arg), arg)
		}
		if _, err := io.WriteString(conn, b.String()); err != nil {
			return nil, err
		}
		reply, err := readReply(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", args[0], err)
		}
		replies = append(replies, reply)
	}
	return replies, nil
}

// redisError is a Redis error reply such as "ERR unknown command".
type redisError string

func (e redisError) Error() string { return string(e) }

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("resp: empty line")
	}
	kind, rest := line[0], line[1:]
	switch kind {
	case '+':
		return rest, nil
	case '-':
		return nil, redisError(rest)
	case ':':
		return strconv.ParseInt(rest, 10, 64)
	case '$':
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 {
			return nil, err // nil bulk string for n == -1
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(rest)
		if err != nil || n < 0 {
			return nil, err
		}
		items := make([]any, n)
		for i := range items {
			if items[i], err = readReply(r); err != nil {
				var re redisError
				if !errors.As(err, &re) {
					return nil, err
				}
				items[i] = re
			}
		}
		return items, nil
	default:
		return nil, fmt.Errorf("resp: unexpected reply %q", line)
	}
}

// infoField returns field's value from an INFO reply ("field:value" lines).
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if value, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return value
		}
	}
	return ""
}
