// Package testenv gives tests the real servers they run against: the shared
// standalone Redis and Redis Cluster that `make test` starts (hack/test.sh via
// hack/redis-cluster.sh), private servers a test may stop, kill or fail over,
// the envtest binaries and a Chromium binary.
//
// A missing prerequisite fails the test when the test command demands real
// servers (LIMITER_TEST_REQUIRE=1, set by `make test`) and skips it otherwise,
// so a bare `go test ./...` still runs everything that needs nothing.
package testenv
