package testenv

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Proc makes sure this machine lists a process's sockets under /proc
// (Linux), which Listening reads: when it does not, the test fails if
// Required, and skips otherwise.
func Proc(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/proc/self/net/tcp"); err != nil {
		missing(t, "/proc/self/net/tcp is not readable ("+err.Error()+")", "must run on Linux, where /proc lists a process's sockets")
	}
}

// RawRESP sends one command to addr as any local process could (no
// password, no client library) and returns the first line of the reply;
// false when addr took no connection or gave no reply.
func RawRESP(addr string, args ...string) (string, bool) {
	conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return "", false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	cmd := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		cmd += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(cmd)); err != nil {
		return "", false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", false
	}
	return strings.TrimRight(line, "\r\n"), true
}

// Listening returns a dialable address of every TCP socket that process
// pid ("self" for this one) listens on: its socket inodes (/proc/PID/fd)
// matched against the LISTEN entries of /proc/PID/net/tcp and tcp6.
func Listening(t testing.TB, pid string) []string {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(filepath.Join("/proc", pid, "fd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc", pid, "fd", fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var addrs []string
	for _, table := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(filepath.Join("/proc", pid, "net", table))
		if err != nil {
			continue // no IPv6
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			// sl local_address rem_address st ... inode
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			if addr, ok := procAddr(f[1]); ok {
				addrs = append(addrs, addr)
			}
		}
	}
	return addrs
}

// procAddr decodes a /proc/net/tcp address, IP:PORT in hex with the IP's
// 32-bit words in host (little-endian) order; an unspecified IP becomes
// the loopback one, which a process beside it would dial.
func procAddr(s string) (string, bool) {
	hexIP, hexPort, ok := strings.Cut(s, ":")
	raw, err := hex.DecodeString(hexIP)
	port, perr := strconv.ParseUint(hexPort, 16, 16)
	if !ok || err != nil || perr != nil || len(raw)%4 != 0 {
		return "", false
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	if ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
		if len(raw) == net.IPv6len {
			ip = net.IPv6loopback
		}
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10)), true
}
