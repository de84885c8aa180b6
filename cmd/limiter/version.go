package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Set at link time:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)" ./cmd/limiter
//
// Left empty, they come from the module's build information.
var (
	version string
	commit  string
)

// build says what this binary is.
type build struct {
	Version string
	Commit  string
	Go      string
}

// currentBuild returns the link-time version and commit, else those the Go
// toolchain recorded, else "unknown".
func currentBuild() build {
	b := build{Version: version, Commit: commit, Go: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if ok {
		if b.Version == "" {
			b.Version = info.Main.Version // a tag when installed by module version; "(devel)" when built in a checkout
		}
		modified := false
		revision := ""
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if b.Commit == "" && revision != "" {
			b.Commit = revision
			if modified {
				b.Commit += " (modified)"
			}
		}
	}
	if b.Version == "" {
		b.Version = "unknown"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Long: `Print the version, commit and Go version of this binary. Release builds
set them with -ldflags "-X main.version=... -X main.commit=..."; otherwise
they come from the build information the Go toolchain recorded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := currentBuild()
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "version: %s\ncommit:  %s\ngo:      %s %s/%s\n",
				b.Version, b.Commit, b.Go, runtime.GOOS, runtime.GOARCH)
			return err
		},
	}
}
