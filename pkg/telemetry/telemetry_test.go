package telemetry

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestPropagatorChoice(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     string // OTEL_PROPAGATORS
		want    []string
		wantErr string
	}{
		{name: "unset: W3C trace context and baggage", env: "", want: []string{"baggage", "traceparent", "tracestate"}},
		{name: "tracecontext alone", env: "tracecontext", want: []string{"traceparent", "tracestate"}},
		{name: "a list with spaces", env: "tracecontext, baggage", want: []string{"baggage", "traceparent", "tracestate"}},
		{name: "none reads and writes nothing", env: "none", want: nil},
		{name: "none wins in a list", env: "tracecontext,none", want: nil},
		{name: "another standard propagator is served", env: "b3", want: []string{"b3"}},
		{name: "an unknown propagator is refused, naming the variable", env: "tracecontext,w3c", wantErr: `OTEL_PROPAGATORS="tracecontext,w3c"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_PROPAGATORS", tc.env)
			tel, err := New(context.Background(), Options{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New: %v; want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer tel.Shutdown(context.Background())
			got := tel.Propagator.Fields()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Propagator.Fields() = %q, want %q", got, tc.want)
			}
		})
	}
}
