package telemetry

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestEndpointURL(t *testing.T) {
	for _, tc := range []struct {
		name, endpoint, signalPath, want, wantErr string
	}{
		{name: "a bare host:port is plaintext", endpoint: "collector:4317", want: "http://collector:4317"},
		{name: "an https URL keeps TLS", endpoint: "https://collector:4317", want: "https://collector:4317"},
		{name: "HTTP adds the signal path", endpoint: "http://collector:4318", signalPath: "/v1/traces", want: "http://collector:4318/v1/traces"},
		{name: "HTTP keeps a base path", endpoint: "https://otlp.example/base/", signalPath: "/v1/traces", want: "https://otlp.example/base/v1/traces"},
		{name: "another scheme is refused", endpoint: "ftp://collector", wantErr: "http(s)://"},
		{name: "no host is refused", endpoint: "http://", wantErr: "host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := endpointURL(tc.endpoint, tc.signalPath)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("endpointURL(%q): %q, %v; want an error containing %q", tc.endpoint, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("endpointURL(%q, %q) = %q, %v; want %q", tc.endpoint, tc.signalPath, got, err, tc.want)
			}
		})
	}
}

func TestExporterChoice(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		// inCode passes an in-memory SpanExporter in Options.
		inCode  bool
		env     map[string]string
		want    string // Exporter(); "" when traces are off
		wantErr string
	}{
		{name: "no endpoint anywhere: no traces", want: ""},
		{name: "the config endpoint: gRPC by default", endpoint: "collector:4317", want: "otlp grpc collector:4317"},
		{name: "OTEL_EXPORTER_OTLP_PROTOCOL picks HTTP", endpoint: "http://collector:4318",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, want: "otlp http/protobuf http://collector:4318"},
		{name: "the standard endpoint variable alone turns traces on",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env-collector:4317"}, want: "otlp grpc http://env-collector:4317"},
		{name: "the config endpoint wins over the environment's", endpoint: "collector:4317",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env-collector:4317"}, want: "otlp grpc collector:4317"},
		{name: "an unknown protocol is refused", endpoint: "collector:4317",
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "OTEL_TRACES_EXPORTER=otlp with an endpoint is the default", endpoint: "collector:4317",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: "otlp grpc collector:4317"},
		{name: "OTEL_TRACES_EXPORTER=none turns export off despite the config endpoint", endpoint: "collector:4317",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: ""},
		{name: "OTEL_TRACES_EXPORTER=none turns export off despite the environment's endpoint",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env-collector:4317"}, want: ""},
		{name: "OTEL_TRACES_EXPORTER=otlp without an endpoint sends to the local gRPC default",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: "otlp grpc http://localhost:4317"},
		{name: "OTEL_TRACES_EXPORTER=otlp without an endpoint sends to the local HTTP default",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, want: "otlp http/protobuf http://localhost:4318"},
		{name: "an unknown OTEL_TRACES_EXPORTER is refused", endpoint: "collector:4317",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "a SpanExporter given in code is used whatever OTEL_TRACES_EXPORTER says", inCode: true,
			env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: "*tracetest.InMemoryExporter"},
		{name: "OTEL_SDK_DISABLED=true records no span despite an endpoint", endpoint: "collector:4317",
			env: map[string]string{"OTEL_SDK_DISABLED": "true"}, want: ""},
		{name: "OTEL_SDK_DISABLED=TRUE is true too", env: map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env-collector:4317"}, want: ""},
		{name: "OTEL_SDK_DISABLED=true drops a SpanExporter given in code too", inCode: true,
			env: map[string]string{"OTEL_SDK_DISABLED": "true"}, want: ""},
		{name: "OTEL_SDK_DISABLED=false changes nothing", endpoint: "collector:4317",
			env: map[string]string{"OTEL_SDK_DISABLED": "false"}, want: "otlp grpc collector:4317"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
				"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
				t.Setenv(k, tc.env[k])
			}
			opts := Options{OTLPEndpoint: tc.endpoint}
			if tc.inCode {
				opts.SpanExporter = tracetest.NewInMemoryExporter()
			}
			tel, err := New(context.Background(), opts)
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
			if got := tel.Exporter(); got != tc.want {
				t.Errorf("Exporter() = %q, want %q", got, tc.want)
			}
			// Never ended: nothing is queued for a collector that is not there.
			_, span := tel.TracerProvider.Tracer("test").Start(context.Background(), "probe")
			if got, want := span.IsRecording(), tc.want != ""; got != want {
				t.Errorf("a span is recording: %t, want %t", got, want)
			}
		})
	}
}
