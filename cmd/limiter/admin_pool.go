package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/spf13/cobra"
)

// poolKeyHelp says how a pool key is named on the command line.
const poolKeyHelp = `POOL is a pool's name as configured (model); KEY one of its keys, as an
acquire names it: case-sensitive, 1-128 bytes of [A-Za-z0-9._:/@-], a '/'
written as it is (meta-llama/Llama-3.1-70B-Instruct). A key that starts
with '-' follows "--", which ends the flags: put the flags before it
(model -- -eu).`

func newAdminPoolCommand(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "pool POOL KEY",
		Short: "Show who holds and who waits for a pool key, its cap and override (role viewer or operator)",
		Long: `Show the live memberships of a pool key (each holder's user and stream,
since when, which caller took it for what), the pool's cap of the key, the
key's override in force, and the acquires waiting for it (wait_ms) in the
order they will be served: higher priority first, then the user holding
the fewest of the key's memberships, then the user waiting for the
fewest, then arrival.

` + poolKeyHelp,
		Example: "  limiter admin pool model gpt-4o",
		Args:    namedArgs("POOL", "KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			out, err := c.PoolKey(f.ctx(cmd), args[0], args[1])
			if err != nil {
				return f.failure(err)
			}
			return f.print(cmd.OutOrStdout(), out, func(w io.Writer) { printPoolKey(w, out) })
		},
	}
}

func newAdminPoolOverrideCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool-override",
		Short: "Set or remove a temporary override of a pool key's cap (role operator)",
		Long: `Set or remove a temporary override of one pool key's cap (role operator).
While an override is in force, every stream that joins the key is judged by
its limit instead of the pool's cap; it lapses by itself. limiter admin pool
POOL KEY shows the override in force.

` + poolKeyHelp,
	}
	cmd.AddCommand(newOverrideSetCommand(f, poolKeyTarget()), newOverrideRemoveCommand(f, poolKeyTarget()))
	return cmd
}

// poolKeyTarget is a pool key's override: limiter admin pool-override.
func poolKeyTarget() overrideTarget {
	return overrideTarget{
		args:     "POOL KEY",
		name:     func(args []string) string { return "pool key " + args[0] + "=" + args[1] },
		limit:    "the pool key's cap",
		most:     httpapi.MaxPoolOverrideStreams,
		fallback: "the pool's cap",
		set: func(ctx context.Context, c *client.Admin, args []string, streams int, expiresIn time.Duration, reason string) (any, httpapi.AdminOverride, string, error) {
			out, err := c.SetPoolOverride(ctx, args[0], args[1], streams, expiresIn, reason)
			return out, out.Override, out.AuditID, err
		},
		remove: func(ctx context.Context, c *client.Admin, args []string, reason string) (httpapi.AdminOverrideRemoveResponse, error) {
			return c.RemovePoolOverride(ctx, args[0], args[1], reason)
		},
		setExample:    `limiter admin pool-override set model gpt-4o --max-streams 600 --expires-in 4h --reason "ticket 4900: launch traffic"`,
		removeExample: `limiter admin pool-override remove model gpt-4o --reason "ticket 4900: launch over"`,
	}
}

func printPoolKey(w io.Writer, p httpapi.AdminPoolKeyResponse) {
	limit := "not capped"
	if p.Limit != nil {
		limit = fmt.Sprintf("the pool's cap %d", *p.Limit)
		if shadow(p.Enforce) {
			limit += " (" + shadowMark + ": nothing is refused, streams over it are counted as would_refuse)"
		}
	}
	if p.Deleted {
		limit = "pool deleted: its holders run on until they end, none joins it"
		if p.Limit != nil {
			limit += fmt.Sprintf(" (its last cap %d)", *p.Limit)
		}
	}
	fmt.Fprintf(w, "pool key %s=%s: %d live %s, %s\n", p.Pool, p.Key, p.Used, plural(p.Used, "membership", "memberships"), limit)
	if o := p.Override; o != nil {
		printOverride(w, *o)
	}
	printSlotTable(w, p.Holders, p.Used, true)
	printTicketTable(w, p.Waiters, true)
}
