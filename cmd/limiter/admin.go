package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/spf13/cobra"
)

// Environment of the admin commands.
const (
	envAdminURL    = "LIMITER_ADMIN_URL"
	envAdminToken  = "LIMITER_ADMIN_TOKEN"
	envAdminCAFile = "LIMITER_ADMIN_CA_FILE"
)

// defaultAdminURL is the admin listener of a limiter on this machine, at
// admin.addr's default.
const defaultAdminURL = "http://127.0.0.1:8081"

// adminFlags are the flags every admin command shares.
type adminFlags struct {
	url     string
	token   string
	caFile  string
	timeout time.Duration
	output  string
	// wrote: a request of the command's call was written to the admin
	// API (see ctx): unanswered, it may have been done.
	wrote atomic.Bool
}

// ctx is cmd's context, noting in f.wrote when a request is written.
func (f *adminFlags) ctx(cmd *cobra.Command) context.Context {
	return httptrace.WithClientTrace(cmd.Context(), &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				f.wrote.Store(true)
			}
		},
	})
}

func newAdminCommand() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Inspect and release a user's slots, see who holds a pool key, and override their limits, through a running limiter's admin API",
		Long: `Inspect and release a user's slots, see who holds a pool key, and override
a user's limit or a pool key's cap for a while, through the admin API of a
running limiter (the service must have admin.tokensFile set). Every call is
audited under the name of the token used.

The server comes from --url, else ` + envAdminURL + `, else http://127.0.0.1:8081
(the admin listener, admin.addr; not the API's port);
the token from --token, else ` + envAdminToken + `. Prefer the environment for the
token: a flag is visible to every user of the machine in the process list.
A limiter with http.tls set serves its admin listener over TLS too: give an
https:// URL, and --ca-file (else ` + envAdminCAFile + `), a PEM bundle of the
CAs that signed its certificate, unless the system's roots trust it.

Exit codes: 0 on success, 1 when the server refused or failed the call,
2 for a usage error.`,
	}
	flags := cmd.PersistentFlags()
	flags.StringVar(&f.url, "url", "", "base URL of the limiter's admin listener, admin.addr (env "+envAdminURL+") (default "+defaultAdminURL+")")
	flags.StringVar(&f.token, "token", "", "admin token (env "+envAdminToken+"; prefer it: flags show in the process list)")
	flags.StringVar(&f.caFile, "ca-file", "", "PEM bundle of the CAs trusted for an https:// --url (env "+envAdminCAFile+") (default the system roots)")
	flags.DurationVar(&f.timeout, "timeout", 10*time.Second, "deadline of the call")
	flags.StringVarP(&f.output, "output", "o", "text", "output format: text or json")

	cmd.AddCommand(
		&cobra.Command{
			Use:   "slots USER",
			Short: "List a user's live slots, who holds them since when, the user's override and waiting acquires (role viewer or operator)",
			Args:  namedArgs("USER"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := f.client()
				if err != nil {
					return err
				}
				out, err := c.Slots(f.ctx(cmd), args[0])
				if err != nil {
					return f.failure(err)
				}
				return f.print(cmd.OutOrStdout(), out, func(w io.Writer) { printSlots(w, out) })
			},
		},
		newAdminReleaseCommand(&f),
		newAdminOverrideCommand(&f),
		newAdminPoolCommand(&f),
		newAdminPoolOverrideCommand(&f),
		newAdminAuditCommand(&f),
	)
	return cmd
}

func newAdminAuditCommand(f *adminFlags) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List the most recent admin calls, newest first (role viewer or operator)",
		Long: `List the most recent admin calls, newest first: --limit of them (1 to
` + strconv.Itoa(httpapi.MaxAuditLimit) + `, default ` + strconv.Itoa(httpapi.DefaultAuditLimit) + `). The text output cuts a reason past ` + strconv.Itoa(auditReasonWidth) + ` characters;
-o json gives every record whole.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > httpapi.MaxAuditLimit {
				return fmt.Errorf("--limit must be 1 to %d, got %d", httpapi.MaxAuditLimit, limit)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			out, err := c.AuditLast(f.ctx(cmd), limit)
			if err != nil {
				return f.failure(err)
			}
			return f.print(cmd.OutOrStdout(), out, func(w io.Writer) { printAudit(w, out.Records) })
		},
	}
	cmd.Flags().IntVar(&limit, "limit", httpapi.DefaultAuditLimit, "how many of the most recent calls to list")
	return cmd
}

func newAdminReleaseCommand(f *adminFlags) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "release USER --reason TEXT",
		Short: "Release every slot of a user (role operator); the reason is audited",
		Long: `Release every slot of a user (role operator). The holders' next heartbeat
is answered 410 slot_lost, so their streams stop. --reason is required and
recorded in the audit with your token's name.`,
		Args: namedArgs("USER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkReasonFlag(reason, `--reason "ticket 4812: locked out after a crash"`); err != nil {
				return err
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			out, err := c.ReleaseAll(f.ctx(cmd), args[0], reason)
			if err != nil {
				return f.failure(err)
			}
			return f.print(cmd.OutOrStdout(), out, func(w io.Writer) {
				fmt.Fprintf(w, "released %d %s of user %s", len(out.Released), plural(len(out.Released), "slot", "slots"), args[0])
				if len(out.Released) > 0 {
					fmt.Fprintf(w, ": %s", strings.Join(out.Released, ", "))
				}
				fmt.Fprintf(w, "\naudit id: %s\n", out.AuditID)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", fmt.Sprintf("why the slots are released (required, at most %d characters)", httpapi.MaxReasonLength))
	return cmd
}

// client checks the flags and environment and returns a client.
func (f *adminFlags) client() (*client.Admin, error) {
	base := f.url
	if base == "" {
		base = os.Getenv(envAdminURL)
	}
	if base == "" {
		base = defaultAdminURL
	}
	token := f.token
	if token == "" {
		token = os.Getenv(envAdminToken)
	}
	if strings.TrimSpace(token) == "" {
		return nil, fmt.Errorf("no admin token: set %s (or --token)", envAdminToken)
	}
	if f.output != "text" && f.output != "json" {
		return nil, fmt.Errorf("--output must be text or json, got %q", f.output)
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--timeout must be > 0, got %s", f.timeout)
	}
	opts := []client.Option{client.WithRequestTimeout(f.timeout)}
	caFile := f.caFile
	if caFile == "" {
		caFile = os.Getenv(envAdminCAFile)
	}
	if caFile != "" {
		tlsConfig, err := adminTLSConfig(base, caFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLSConfig(tlsConfig))
	}
	c, err := client.NewAdmin(base, strings.TrimSpace(token), opts...)
	if err != nil {
		return nil, fmt.Errorf("--url (env %s): %w", envAdminURL, err)
	}
	return c, nil
}

// adminTLSConfig trusts the CAs of caFile for base. A CA file beside a
// plain http:// URL is refused, not ignored: whoever set it meant the
// token to travel encrypted.
func adminTLSConfig(base, caFile string) (*tls.Config, error) {
	if u, err := url.Parse(base); err != nil || u.Scheme != "https" {
		return nil, fmt.Errorf("--ca-file (env %s) is for an https:// URL, got --url (env %s) %q", envAdminCAFile, envAdminURL, base)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file (env %s): %w", envAdminCAFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file (env %s) %s: no PEM certificate in it", envAdminCAFile, caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// failure marks err of an admin call as the server's failure, and words
// an answer of the admin API for the command line.
func (f *adminFlags) failure(err error) error {
	var answer *client.Error
	var unreached *url.Error
	switch {
	case errors.As(err, &answer):
		err = adminRefusal{answer}
	case errors.Is(err, client.ErrUnavailable) && errors.As(err, &unreached) && f.wrote.Load() && unreached.Op != http.MethodGet && unreached.Op != "Get":
		// Sent, and no answer within --timeout: a change may have been
		// made all the same.
		err = fmt.Errorf("the admin API did not answer %s %s within --timeout: %w; it may have been done all the same: list the slots (limiter admin slots USER, limiter admin pool POOL KEY) to see what holds now",
			strings.ToUpper(unreached.Op), unreached.URL, unreached.Err)
	case errors.Is(err, client.ErrUnavailable) && errors.As(err, &unreached):
		// No answer at all: the admin listener, not the limiter's Redis.
		err = fmt.Errorf("the admin API did not answer %s %s: %w (is --url, env %s, the admin listener, admin.addr?)%s",
			strings.ToUpper(unreached.Op), unreached.URL, unreached.Err, envAdminURL, tlsHint(unreached))
	}
	return serveFailure{err}
}

// tlsHint says why an https:// URL's handshake failed, when it is the
// admin listener's certificate that is not trusted here.
func tlsHint(err *url.Error) string {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.As(err, &unknownCA):
		return "; its certificate is signed by a CA not trusted here: give that CA with --ca-file (env " + envAdminCAFile + ")"
	case errors.As(err, &hostname):
		return "; its certificate does not name the host of --url"
	}
	return ""
}

// adminRefusal is a non-2xx answer of the admin API.
type adminRefusal struct{ answer *client.Error }

func (r adminRefusal) Error() string {
	msg := r.answer.Message
	if r.answer.Status == http.StatusNotFound {
		// The admin routes exist only on the admin listener of a server
		// with admin tokens.
		msg += " (is --url the admin listener, admin.addr, and admin.tokensFile set on the server?)"
	}
	return fmt.Sprintf("the admin API answered %d %s: %s", r.answer.Status, r.answer.Code, msg)
}

func (r adminRefusal) Unwrap() error { return r.answer }

// print writes v as JSON with -o json, else as text.
func (f *adminFlags) print(w io.Writer, v any, text func(io.Writer)) error {
	if f.output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(w)
	return nil
}

func printSlots(w io.Writer, s httpapi.AdminSlotsResponse) {
	fmt.Fprintf(w, "user %s: %d live %s\n", s.UserID, s.Used, plural(s.Used, "slot", "slots"))
	printPlanLimits(w, s.PlanLimits)
	if o := s.Override; o != nil {
		printOverride(w, *o)
	}
	printSlotTable(w, s.Slots, s.Used, false)
	printTicketTable(w, s.Queue, false)
}

// shadowMark follows a limit that refuses nothing: its plan or pool is in
// shadow mode (enforce: false), so what it counts can be above it.
const shadowMark = "shadow - not enforced"

// shadow reports whether enforce, an answer's, says shadow mode: a server
// older than the field sends none, and enforces.
func shadow(enforce *bool) bool { return enforce != nil && !*enforce }

// printPlanLimits writes, when one of them is in shadow mode, the limit
// of each plan the user's slots and waiting acquires are under (each
// acquire is judged by its own plan's), marking those in shadow mode: the
// user may hold more than such a limit, and support must not take it for
// a lockout. Nothing when every plan's limit refuses, as before the mark.
func printPlanLimits(w io.Writer, limits []httpapi.AdminPlanLimit) {
	if !slices.ContainsFunc(limits, func(l httpapi.AdminPlanLimit) bool { return shadow(l.Enforce) }) {
		return
	}
	parts := make([]string, len(limits))
	for i, l := range limits {
		parts[i] = fmt.Sprintf("plan %s allows %d", l.Plan, l.Limit)
		if shadow(l.Enforce) {
			parts[i] += " (" + shadowMark + ": nothing is refused, acquires over it are counted as would_refuse)"
		}
	}
	fmt.Fprintf(w, "%s: %s\n", plural(len(limits), "limit", "limits"), strings.Join(parts, "; "))
}

// printSlotTable writes slots as a table, each with its user when
// withUser (a pool key's holders), and how many of used (the live slots,
// listed or not) are not listed; nothing when there are none.
func printSlotTable(w io.Writer, slots []httpapi.AdminSlot, used int, withUser bool) {
	if len(slots) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	user := func(slot httpapi.AdminSlot) string { return "" }
	if withUser {
		fmt.Fprint(tw, "USER\t")
		user = func(slot httpapi.AdminSlot) string { return slot.UserID + "\t" }
	}
	fmt.Fprintln(tw, "STREAM ID\tAGE\tCALLER\tPLAN\tLABEL\tTIME LEFT\tEXPIRES AT")
	for _, slot := range slots {
		age := "-"
		if slot.AgeMs != nil {
			age = (time.Duration(*slot.AgeMs) * time.Millisecond).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\n", user(slot), slot.StreamID, age, dash(slot.Caller), dash(slot.Plan), dash(slot.Label),
			(time.Duration(slot.TTLMs) * time.Millisecond).Round(time.Second), slot.ExpiresAt.UTC().Format(time.RFC3339))
	}
	tw.Flush()
	if used > len(slots) {
		fmt.Fprintf(w, "(the first %d of %d to expire; %d more not listed)\n", len(slots), used, used-len(slots))
	}
}

// printTicketTable writes the acquires waiting in a queue, first served
// first, each with its user when withUser (a pool key's waiters); nothing
// when none waits.
func printTicketTable(w io.Writer, tickets []httpapi.AdminTicket, withUser bool) {
	if len(tickets) == 0 {
		return
	}
	fmt.Fprintf(w, "%d %s waiting, first served first:\n", len(tickets), plural(len(tickets), "acquire", "acquires"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "PLACE\tPRIORITY\t")
	user := func(httpapi.AdminTicket) string { return "" }
	if withUser {
		fmt.Fprint(tw, "USER\t")
		user = func(t httpapi.AdminTicket) string { return t.UserID + "\t" }
	}
	fmt.Fprintln(tw, "STREAM ID\tPLAN\tCALLER\tLABEL\tWAITED")
	for _, t := range tickets {
		fmt.Fprintf(tw, "%d\t%d\t%s%s\t%s\t%s\t%s\t%s\n", t.Place, t.Priority, user(t), t.StreamID, dash(t.Plan), dash(t.Caller), dash(t.Label),
			(time.Duration(t.WaitedMs) * time.Millisecond).Round(100*time.Millisecond))
	}
	tw.Flush()
}

func printAudit(w io.Writer, records []httpapi.AuditRecord) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tACTOR\tROLE\tACTION\tUSER/POOL KEY\tOUTCOME\tRESULT\tREASON\tAUDIT ID")
	for _, r := range records {
		subject := r.UserID
		if r.Pool != "" || r.Key != "" {
			subject = r.Pool + "=" + r.Key
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.UTC().Format(time.RFC3339), dash(r.Actor), dash(r.Role),
			r.Action, dash(subject), r.Outcome, auditResult(r), dash(cut(r.Reason, auditReasonWidth)), r.AuditID)
	}
	tw.Flush()
}

// auditResult is what a recorded call changed, as the admin page shows
// it: the slots a release_all freed, the override set or whether one was
// removed; for a set_override refused, the override it asked for, as
// sent.
func auditResult(r httpapi.AuditRecord) string {
	switch {
	case r.Action == httpapi.ActionReleaseAll && r.Outcome == httpapi.OutcomeOK:
		return fmt.Sprintf("%d %s released", len(r.Released), plural(len(r.Released), "slot", "slots"))
	case r.Override != nil:
		n := r.Override.MaxConcurrentStreams
		return fmt.Sprintf("%d %s until %s", n, plural(n, "stream", "streams"), r.Override.ExpiresAt.UTC().Format(time.RFC3339))
	case r.OverrideRemoved != nil && *r.OverrideRemoved:
		return "removed"
	case r.OverrideRemoved != nil:
		return "none in force"
	case r.Asked != nil:
		return askedText(*r.Asked)
	}
	return "-"
}

// askedText is the override a set_override asked for: each field as sent
// and kept (see httpapi.AuditOverrideAsked).
func askedText(a httpapi.AuditOverrideAsked) string {
	var parts []string
	if n := a.MaxConcurrentStreams; n != nil {
		parts = append(parts, fmt.Sprintf("%d %s", *n, plural(*n, "stream", "streams")))
	}
	if a.ExpiresIn != nil {
		parts = append(parts, fmt.Sprintf("for %ds", *a.ExpiresIn))
	}
	if len(parts) == 0 {
		return "-"
	}
	return "asked " + strings.Join(parts, " ")
}

// auditReasonWidth is how much of a reason the audit's text shows: a
// reason may be 500 characters, which would widen every row.
const auditReasonWidth = 60

// cut is s cut to at most n characters, the last an ellipsis when cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// namedArgs accepts exactly the arguments names names ("USER", "POOL",
// "KEY"), each of them not empty: an empty one would address another
// path of the admin API (no route), not the user or key it names.
func namedArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(len(names))(cmd, args); err != nil {
			return err
		}
		for i, a := range args {
			if strings.TrimSpace(a) == "" {
				return fmt.Errorf("%s is empty: name one (see %s --help)", names[i], cmd.CommandPath())
			}
		}
		return nil
	}
}
