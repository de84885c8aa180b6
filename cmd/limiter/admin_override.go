package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

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
	cmd.AddCommand(newOverrideSetCommand(f), newOverrideRemoveCommand(f))
	return cmd
}

func newOverrideSetCommand(f *adminFlags) *cobra.Command {
	var (
		streams   int
		expiresIn time.Duration
		reason    string
	)
	cmd := &cobra.Command{
		Use:   "set USER --max-streams N --expires-in DURATION --reason TEXT",
		Short: "Let a user hold N streams, whatever the plan, until the override expires",
		Long: fmt.Sprintf(`Let a user hold --max-streams streams (0 to %d; 0: none), on every plan,
for --expires-in (whole seconds, %s to %s), replacing any override before
it. Slots already held are kept. --reason is required and recorded in the
audit with your token's name.`, httpapi.MaxOverrideStreams,
			time.Duration(httpapi.MinOverrideExpiresIn)*time.Second, time.Duration(httpapi.MaxOverrideExpiresIn)*time.Second),
		Example: `  limiter admin override set user-42 --max-streams 5 --expires-in 24h --reason "ticket 4812: 5 streams for the launch"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("max-streams") {
				return fmt.Errorf("--max-streams is required: the user's limit while the override is in force, 0 to %d", httpapi.MaxOverrideStreams)
			}
			if streams < 0 || streams > httpapi.MaxOverrideStreams {
				return fmt.Errorf("--max-streams must be 0 to %d, got %d", httpapi.MaxOverrideStreams, streams)
			}
			lo, hi := time.Duration(httpapi.MinOverrideExpiresIn)*time.Second, time.Duration(httpapi.MaxOverrideExpiresIn)*time.Second
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
			out, err := c.SetOverride(cmd.Context(), args[0], streams, expiresIn, reason)
			if err != nil {
				return adminFailure(err)
			}
			return f.print(cmd.OutOrStdout(), out, func(w io.Writer) {
				fmt.Fprintf(w, "user %s: ", args[0])
				printOverride(w, out.Override)
				fmt.Fprintf(w, "audit id: %s\n", out.AuditID)
			})
		},
	}
	cmd.Flags().IntVar(&streams, "max-streams", 0, fmt.Sprintf("the user's limit while in force, 0 to %d (required)", httpapi.MaxOverrideStreams))
	cmd.Flags().DurationVar(&expiresIn, "expires-in", 0, "how long it stays in force, e.g. 24h (required)")
	cmd.Flags().StringVar(&reason, "reason", "", fmt.Sprintf("why (required, at most %d characters)", httpapi.MaxReasonLength))
	return cmd
}

func newOverrideRemoveCommand(f *adminFlags) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "remove USER --reason TEXT",
		Short: "End a user's override now: the plan's limit applies again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkReasonFlag(reason, `--reason "ticket 4812: plan upgraded"`); err != nil {
				return err
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			out, err := c.RemoveOverride(cmd.Context(), args[0], reason)
			if err != nil {
				return adminFailure(err)
			}
			return f.print(cmd.OutOrStdout(), out, func(w io.Writer) {
				if out.Removed {
					fmt.Fprintf(w, "removed the override of user %s: the plan's limit applies again\n", args[0])
				} else {
					fmt.Fprintf(w, "user %s had no override in force\n", args[0])
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
	if n := len([]rune(reason)); n > httpapi.MaxReasonLength {
		return fmt.Errorf("--reason is %d characters, the limit is %d", n, httpapi.MaxReasonLength)
	}
	return nil
}

// printOverride writes one line describing o.
func printOverride(w io.Writer, o httpapi.AdminOverride) {
	fmt.Fprintf(w, "override: %d %s until %s (%s left), set by %s: %s\n", o.MaxConcurrentStreams,
		plural(o.MaxConcurrentStreams, "stream", "streams"), o.ExpiresAt.UTC().Format(time.RFC3339),
		(time.Duration(o.TTLMs) * time.Millisecond).Round(time.Second), dash(o.Actor), o.Reason)
}
