package telemetry

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// OTLP protocols, as OTEL_EXPORTER_OTLP_PROTOCOL names them.
const (
	protocolGRPC = "grpc"
	protocolHTTP = "http/protobuf"
)

// Where OTEL_TRACES_EXPORTER=otlp sends the spans when no endpoint is
// named, as the OTLP specification says.
const (
	defaultGRPCEndpoint = "http://localhost:4317"
	defaultHTTPEndpoint = "http://localhost:4318"
)

// spanExporter returns the exporter opts and the environment ask for and a
// description of it, or nil when traces are off: OTEL_SDK_DISABLED=true,
// OTEL_TRACES_EXPORTER=none, or no endpoint and OTEL_TRACES_EXPORTER
// unset. The exporters themselves read the rest of the standard
// environment (headers, certificates, timeout, compression).
func spanExporter(ctx context.Context, opts Options) (sdktrace.SpanExporter, string, error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, "", nil
	}
	if opts.SpanExporter != nil {
		return opts.SpanExporter, fmt.Sprintf("%T", opts.SpanExporter), nil
	}
	kind := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	switch kind {
	case "", "otlp":
	case "none":
		return nil, "", nil
	default:
		return nil, "", fmt.Errorf("OTEL_TRACES_EXPORTER must be otlp or none, got %q", kind)
	}
	protocol := firstSet(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), protocolGRPC)
	// endpoint is given to the exporter; "" leaves it to the environment's.
	endpoint := opts.OTLPEndpoint
	envEndpoint := firstSet(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	if endpoint == "" && envEndpoint == "" {
		if kind == "" {
			return nil, "", nil
		}
		endpoint = defaultGRPCEndpoint
		if protocol == protocolHTTP {
			endpoint = defaultHTTPEndpoint
		}
	}
	describe := "otlp " + protocol + " " + cmp.Or(endpoint, envEndpoint)
	switch protocol {
	case protocolGRPC:
		var o []otlptracegrpc.Option
		if endpoint != "" {
			u, err := endpointURL(endpoint, "")
			if err != nil {
				return nil, "", err
			}
			o = append(o, otlptracegrpc.WithEndpointURL(u))
		}
		exp, err := otlptracegrpc.New(ctx, o...)
		return exp, describe, err
	case protocolHTTP:
		var o []otlptracehttp.Option
		if endpoint != "" {
			u, err := endpointURL(endpoint, "/v1/traces")
			if err != nil {
				return nil, "", err
			}
			o = append(o, otlptracehttp.WithEndpointURL(u))
		}
		exp, err := otlptracehttp.New(ctx, o...)
		return exp, describe, err
	default:
		return nil, "", fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL must be %s or %s, got %q", protocolGRPC, protocolHTTP, protocol)
	}
}

// endpointURL turns telemetry.otlpEndpoint into a URL: a bare host:port
// is plaintext HTTP, and signalPath is appended to the path, as the OTLP
// specification does for OTEL_EXPORTER_OTLP_ENDPOINT.
func endpointURL(endpoint, signalPath string) (string, error) {
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("telemetry.otlpEndpoint must be host:port or an http(s):// URL, got %q", endpoint)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + signalPath
	return u.String(), nil
}

func firstSet(values ...string) string {
	for _, v := range values {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}
