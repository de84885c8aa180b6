// Command script prints a limiter script as Redis runs it (its shared
// pieces composed in front of its body), byte for byte, for
// hack/bench.sh to load and run with redis-benchmark:
//
//	go run ./hack/bench/script acquire
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/joishi/limiter/pkg/lua"
)

func main() {
	sources := lua.Sources()
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: script NAME")
		os.Exit(2)
	}
	src, ok := sources[os.Args[1]]
	if !ok {
		var names []string
		for name := range sources {
			names = append(names, name)
		}
		slices.Sort(names)
		fmt.Fprintf(os.Stderr, "script: no script %q; the scripts are %s\n", os.Args[1], strings.Join(names, ", "))
		os.Exit(2)
	}
	_, _ = os.Stdout.WriteString(src)
}
