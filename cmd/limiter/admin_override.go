package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/spf13/cobra"
)

func newAdminOverrideCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "override",
		Short: "Set or remove a temporary override of a user's limit (role operator)",
		Long: `Set or remove a temporary override of one user's limit (role operator).
While an override is in force, every acquire of the user, on any plan, is
judged by its limit instead of the plan's; it lapses by itself. limiter
admin slots USER shows the override in force.`,
	}
	cmd.AddCommand(newOverrideSetCommand(f, userTarget()), newOverrideRemoveCommand(f, userTarget()))
	return cmd
}

// overrideTarget is whose limit an override command sets or removes: a
// user's (override) or a pool key's (pool-override). The commands of both
// are one.
type overrideTarget struct {
	// args names the arguments ("USER", "POOL KEY"); their count is the
	// words in it.
	args string
	// name names what the arguments address, in output ("user u-1",
	// "pool key model=gpt-4o").
	name func(args []string) string
	// limit is what an override replaces, as the scope's owner has it
	// ("the user's limit", "the pool key's cap"), and fallback what
	// applies again once it is gone ("the plan's limit").
	limit, fallback string
	// most bounds --max-streams, as the scope's own limit is bounded.
	most int
	// set and remove call the admin API; set returns the answer (printed
	// whole with -o json), the override and the audit id.
	set    func(ctx context.Context, c *client.Admin, args []string, streams int, expiresIn time.Duration, reason string) (answer any, o httpapi.AdminOverride, auditID string, err error)
	remove func(ctx context.Context, c *client.Admin, args []string, reason string) (httpapi.AdminOverrideRemoveResponse, error)
	// setExample and removeExample are a whole command line each.
	setExample, removeExample string
}

// userTarget is a user's override: limiter admin override.
func userTarget() overrideTarget {
	return overrideTarget{
		args:     "USER",
		name:     func(args []string) string { return "user " + args[0] },
		limit:    "the user's limit",
		most:     httpapi.MaxOverrideStreams,
		fallback: "the plan's limit",
		set: func(ctx context.Context, c *client.Admin, args []string, streams int, expiresIn time.Duration, reason string) (any, httpapi.AdminOverride, string, error) {
			out, err := c.SetOverride(ctx, args[0], streams, expiresIn, reason)
			return out, out.Override, out.AuditID, err
		},
		remove: func(ctx context.Context, c *client.Admin, args []string, reason string) (httpapi.AdminOverrideRemoveResponse, error) {
			return c.RemoveOverride(ctx, args[0], reason)
		},
		setExample:    `limiter admin override set user-42 --max-streams 5 --expires-in 24h --reason "ticket 4812: 5 streams for the launch"`,
		removeExample: `limiter admin override remove user-42 --reason "ticket 4812: plan upgraded"`,
	}
}

func newOverrideSetCommand(f *adminFlags, target overrideTarget) *cobra.Command {
	var (
		streams   int
		expiresIn time.Duration
		reason    string
	)
	lo, hi := time.Duration(httpapi.MinOverrideExpiresIn)*time.Second, time.Duration(httpapi.MaxOverrideExpiresIn)*time.Second
	cmd := &cobra.Command{
		Use:   "set " + target.args + " --max-streams N --expires-in DURATION --reason TEXT",
		Short: fmt.Sprintf("Replace %s with N streams until the override expires", target.limit),
		Long: fmt.Sprintf(`Replace %s with --max-streams streams (0 to %d; 0: none)
for --expires-in (whole seconds, %s to %s), replacing any override before
it. Streams already held are kept. --reason is required and recorded in the
audit with your token's name.`, target.limit, target.most, lo, hi),
		Example: "  " + target.setExample,
		Args:    namedArgs(strings.Fields(target.args)...),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("max-streams") {
				return fmt.Errorf("--max-streams is required: %s while the override is in force, 0 to %d", target.limit, target.most)
			}
			if streams < 0 || streams > target.most {
				return fmt.Errorf("--max-streams must be 0 to %d, got %d", target.most, streams)
			}
			switch {
			case !cmd.Flags().Changed("expires-in"):
				return fmt.Errorf("--expires-in is required: how long the override stays in force, %s to %s, e.g. 24h", lo, hi)
			case expiresIn < lo || expiresIn > hi || expiresIn%time.Second != 0:
				return fmt.Errorf("--expires-in must be whole seconds from %s to %s, got %s", lo, hi, expiresIn)
			}
			if err := checkReasonFlag(reason, `--reason "ticket 4812: 5 streams for the launch"`); err != nil {
				return err
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			out, o, auditID, err := target.set(f.ctx(cmd), c, args, streams, expiresIn, reason)
			if err != nil {
				return f.failure(err)
			}
			return f.print(cmd.OutOrStdout(), out, func(w io.Writer) {
				fmt.Fprintf(w, "%s: ", target.name(args))
				printOverride(w, o)
				fmt.Fprintf(w, "audit id: %s\n", auditID)
			})
		},
	}
	cmd.Flags().IntVar(&streams, "max-streams", 0, fmt.Sprintf("%s while in force, 0 to %d (required)", target.limit, target.most))
	cmd.Flags().DurationVar(&expiresIn, "expires-in", 0, "how long it stays in force, e.g. 24h (required)")
	cmd.Flags().StringVar(&reason, "reason", "", fmt.Sprintf("why (required, at most %d characters)", httpapi.MaxReasonLength))
	return cmd
}

func newOverrideRemoveCommand(f *adminFlags, target overrideTarget) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:     "remove " + target.args + " --reason TEXT",
		Short:   fmt.Sprintf("End the override now: %s applies again", target.fallback),
		Example: "  " + target.removeExample,
		Args:    namedArgs(strings.Fields(target.args)...),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkReasonFlag(reason, `--reason "ticket 4812: plan upgraded"`); err != nil {
				return err
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			out, err := target.remove(f.ctx(cmd), c, args, reason)
			if err != nil {
				return f.failure(err)
			}
			return f.print(cmd.OutOrStdout(), out, func(w io.Writer) {
				if out.Removed {
					fmt.Fprintf(w, "removed the override of %s: %s applies again\n", target.name(args), target.fallback)
				} else {
					fmt.Fprintf(w, "%s had no override in force\n", target.name(args))
				}
				fmt.Fprintf(w, "audit id: %s\n", out.AuditID)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", fmt.Sprintf("why (required, at most %d characters)", httpapi.MaxReasonLength))
	return cmd
}

// checkReasonFlag refuses a missing or too long --reason; example shows
// one.
func checkReasonFlag(reason, example string) error {
	if strings.TrimSpace(reason) == "" {
		return errors.New("--reason is required: say why, e.g. " + example)
	}
	// Measured as the admin API measures it: runs of whitespace count as
	// one space.
	if n := len([]rune(strings.Join(strings.Fields(reason), " "))); n > httpapi.MaxReasonLength {
		return fmt.Errorf("--reason is %d characters (runs of whitespace counted as one), the limit is %d", n, httpapi.MaxReasonLength)
	}
	return nil
}

// printOverride writes one line describing o.
func printOverride(w io.Writer, o httpapi.AdminOverride) {
	fmt.Fprintf(w, "override: %d %s until %s (%s left), set by %s: %s\n", o.MaxConcurrentStreams,
		plural(o.MaxConcurrentStreams, "stream", "streams"), o.ExpiresAt.UTC().Format(time.RFC3339),
		(time.Duration(o.TTLMs) * time.Millisecond).Round(time.Second), dash(o.Actor), o.Reason)
}
