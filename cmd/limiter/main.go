// Command limiter serves the concurrent-stream limiter: `limiter serve`
// runs a replica, `limiter proxy` caps streams in front of an existing
// endpoint, `limiter version` says what was built. This file only wires:
// flags and configuration to runServe and runProxy, errors to exit codes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/joishi/limiter/pkg/config"
	"github.com/joishi/limiter/pkg/controller"
	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the service failed while running
	exitUsage   = 2 // bad flags, arguments or configuration
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	// After the first signal, restore the default handling so a second
	// one kills a drain that hangs.
	go func() { <-ctx.Done(); stop() }()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command line args and returns the exit code: 0 after a
// graceful drain, 1 when serving failed, 2 for a usage or configuration
// error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(serveDeps{logs: stderr, watchTiers: (*controller.Controller).Start})
	return execute(ctx, root, args, stdout, stderr)
}

// execute runs root with args and returns the exit code, as run does.
func execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "limiter: "+strings.ReplaceAll(err.Error(), "\n", "\n  "))
	var failed serveFailure
	if errors.As(err, &failed) && !errors.Is(err, config.ErrInvalid) {
		return exitFailure
	}
	return exitUsage
}

// serveFailure marks an error of a running service, as opposed to one of
// the command line or the configuration.
type serveFailure struct{ err error }

func (e serveFailure) Error() string { return e.err.Error() }
func (e serveFailure) Unwrap() error { return e.err }

func newRootCommand(deps serveDeps) *cobra.Command {
	root := &cobra.Command{
		Use:   "limiter",
		Short: "Cap the concurrent AI streams each user may hold, on Redis",
		Long: `limiter caps how many streams each user may hold at once. Slots are kept in
Redis with their own expiry, so a crashed holder's slot frees itself.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())
	})
	root.AddCommand(newServeCommand(deps), newProxyCommand(deps), newVersionCommand(), newAdminCommand())
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes each command below root that only groups
// others (admin, admin override, ...) answer a word that names none of
// them as the usage error it is (exit 2), as root does, rather than with
// its help and exit 0: a script whose `limiter admin relase ana` has a
// typo must not take it for done. Alone, such a command prints its help.
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, cmd := range root.Commands() {
		refuseUnknownSubcommands(cmd)
		if !cmd.HasSubCommands() || cmd.Runnable() {
			continue
		}
		cmd.SuggestionsMinimumDistance = 2
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
				msg += "; did you mean " + strings.Join(suggestions, " or ") + "?"
			}
			return fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())
		}
	}
}

func newServeCommand(deps serveDeps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the limiter API and the ops endpoints until SIGTERM",
		Long: `Serve the HTTP API (http.addr), /healthz, /readyz, /metrics (ops.addr),
with admin.tokensFile the admin API and page (admin.addr), and with
extproc.addr the Envoy ext_proc gRPC service that holds a slot for each
stream Envoy sends through its ext_proc filter, until SIGTERM or interrupt,
then drain in-flight requests for up to http.shutdownGrace and exit 0.

Configuration comes from, in increasing precedence: the defaults, the YAML
file named by --config, the environment, and these flags. Every key of the
file can be set as LIMITER_<KEY>, upper case with '.' turned into '_'
(redis.tls.caFile is LIMITER_REDIS_TLS_CAFILE); lists are comma-separated,
except LIMITER_TIERS_STATIC and LIMITER_POOLS_STATIC, JSON or YAML lists.
A LIMITER_ variable that is no setting stops the start, but for those of the
limiter's tools (LIMITER_TEST_*, LIMITER_TOKEN, ...). config/limiter.yaml
documents every key, and those variables.

With no Redis address, an embedded store is used: it holds this replica's
slots only, so never run more than one replica on it.

Exit codes: 0 after a graceful drain, 1 when serving failed, 2 for a
usage or configuration error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(config.LoadOptions{Flags: cmd.Flags()})
			if err != nil {
				return err
			}
			if err := runServe(cmd.Context(), cfg, deps); err != nil {
				return serveFailure{err}
			}
			return nil
		},
	}
	cmd.Flags().SortFlags = false
	config.AddFlags(cmd.Flags())
	return cmd
}
