// Package envoy_test checks the Envoy configuration shipped in
// config/envoy: the static bootstrap against go-control-plane's types, and
// the Envoy Gateway manifests against the Gateway API and Envoy Gateway
// CRDs on a real kube-apiserver.
package envoy_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpupstreamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/tiers"
)

const bootstrapFile = "envoy.yaml"

// parseBootstrap reads a bootstrap as Envoy does from YAML: YAML to JSON,
// then protojson with unknown fields refused (typed_config resolved by the
// types linked in), then the proto's validation rules.
func parseBootstrap(t *testing.T, data []byte) (*bootstrapv3.Bootstrap, error) {
	t.Helper()
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &b); err != nil {
		return nil, err
	}
	if err := b.ValidateAll(); err != nil {
		return nil, err
	}
	return &b, nil
}

func TestBootstrapParses(t *testing.T) {
	data, err := os.ReadFile(bootstrapFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseBootstrap(t, data)
	if err != nil {
		t.Fatalf("%s: %v", bootstrapFile, err)
	}

	// The control: an unknown field, anywhere, is refused.
	bad := strings.Replace(string(data), "failure_mode_allow: true", "failure_mode_allow: true\n                      fail_open: true", 1)
	if _, err := parseBootstrap(t, []byte(bad)); err == nil || !strings.Contains(err.Error(), "fail_open") {
		t.Errorf("a bootstrap with an unknown field: %v, want it refused", err)
	}

	listeners := b.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%d listeners, want 1", len(listeners))
	}
	var hcm hcmv3.HttpConnectionManager
	if err := listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatalf("the listener's first filter is no HttpConnectionManager: %v", err)
	}

	// The filter: before the router, headers sent, the limiter's cluster.
	filters := hcm.GetHttpFilters()
	if len(filters) != 2 || filters[0].GetName() != "envoy.filters.http.ext_proc" || filters[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http_filters %v, want ext_proc then the router", filters)
	}
	var ep extprocfilterv3.ExternalProcessor
	if err := filters[0].GetTypedConfig().UnmarshalTo(&ep); err != nil {
		t.Fatal(err)
	}
	// Validation rules do not reach into typed_config: check the two
	// configurations the file is about.
	if err := hcm.ValidateAll(); err != nil {
		t.Errorf("HttpConnectionManager: %v", err)
	}
	if err := ep.ValidateAll(); err != nil {
		t.Errorf("ExternalProcessor: %v", err)
	}
	mode := ep.GetProcessingMode()
	if mode.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SEND {
		t.Errorf("request_header_mode %v, want SEND: the slot is taken on the request headers", mode.GetRequestHeaderMode())
	}
	// A body: pool source decides on the whole body, in one message.
	if mode.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_BUFFERED {
		t.Errorf("request_body_mode %v, want BUFFERED: a body: pool source (model: body:model) reads the whole request body", mode.GetRequestBodyMode())
	}
	if m := mode.GetResponseBodyMode(); m == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED || m == extprocfilterv3.ProcessingMode_BUFFERED {
		t.Errorf("response_body_mode %v: buffering a stream, or taking over its bytes, is not what the limiter needs", m)
	}
	// The limiter decides within redis.timeout (250ms) + 100ms.
	if d := ep.GetMessageTimeout().AsDuration(); d < 350*time.Millisecond {
		t.Errorf("message_timeout %s, want at least redis.timeout + 100ms (350ms) so that the tier's failure mode decides an outage", d)
	}
	// A request may wait up to tiers.MaxMaxWait for a slot (extproc.wait),
	// asking Envoy for that plus extproc.TimerMargin.
	if d, want := ep.GetMaxMessageTimeout().AsDuration(), tiers.MaxMaxWait+extproc.TimerMargin; d < want {
		t.Errorf("max_message_timeout %s, want at least %s: the longest wait plus the margin a waiting request asks for", d, want)
	}
	if ep.GetAllowModeOverride() {
		t.Error("allow_mode_override set: the limiter sends no mode_override")
	}
	md := ep.GetGrpcService().GetInitialMetadata()
	if len(md) != 1 || md[0].GetKey() != "authorization" || !strings.HasPrefix(md[0].GetValue(), "Bearer ") {
		t.Errorf("initial_metadata %v, want the caller's bearer token", md)
	}
	clusterName := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()

	// Routes are matched on the normalized path: no other spelling of the
	// limited route passes with the filter disabled.
	if !hcm.GetNormalizePath().GetValue() || !hcm.GetMergeSlashes() ||
		hcm.GetPathWithEscapedSlashesAction() != hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT {
		t.Errorf("normalize_path %v, merge_slashes %v, path_with_escaped_slashes_action %v: want the path normalized before routes match",
			hcm.GetNormalizePath(), hcm.GetMergeSlashes(), hcm.GetPathWithEscapedSlashesAction())
	}

	// No header names the upstream another path than the one routed.
	for _, h := range []string{"x-original-url", "x-rewrite-url", "x-original-uri"} {
		if !slices.Contains(hcm.GetRouteConfig().GetRequestHeadersToRemove(), h) {
			t.Errorf("request_headers_to_remove %v: want %s, which names another path to servers that honour it", hcm.GetRouteConfig().GetRequestHeadersToRemove(), h)
		}
	}

	// The routes: the chat completions route holds a slot, the rest not.
	routes := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()
	var limited []string
	var passed bool
	for _, r := range routes {
		disabled := false
		if cfg, ok := r.GetTypedPerFilterConfig()["envoy.filters.http.ext_proc"]; ok {
			var per extprocfilterv3.ExtProcPerRoute
			if err := cfg.UnmarshalTo(&per); err != nil {
				t.Fatal(err)
			}
			disabled = per.GetDisabled()
		}
		switch r.GetMatch().GetPathSpecifier().(type) {
		case *routev3.RouteMatch_SafeRegex:
			// Every spelling of the route Envoy does not normalize, and
			// anything under it, holds a slot too (chatroute_test.go).
			if !disabled {
				limited = append(limited, r.GetMatch().GetSafeRegex().GetRegex())
				if r.GetRoute().GetTimeout().AsDuration() != 0 {
					t.Errorf("the streaming route has a timeout of %s, want none", r.GetRoute().GetTimeout().AsDuration())
				}
			}
		case *routev3.RouteMatch_Prefix:
			passed = disabled
			// Where the limiter says nothing, an upstream's copy of its
			// headers does not pass for its word.
			for _, h := range []string{"x-limiter-stream-id", "x-limiter-would-refuse"} {
				if !slices.Contains(r.GetResponseHeadersToRemove(), h) {
					t.Errorf("the route with the filter disabled: response_headers_to_remove %v, want %s, the limiter's word alone", r.GetResponseHeadersToRemove(), h)
				}
			}
		}
	}
	if len(limited) == 0 || !passed {
		t.Errorf("routes %v: want /v1/chat/completions through the filter and the rest with it disabled", routes)
	}
	checkChatRoute(t, bootstrapFile, limited)

	// The limiter's cluster: HTTP/2 with keepalive, gRPC health checked.
	var grpcCluster *clusterv3.Cluster
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == clusterName {
			grpcCluster = c
		}
	}
	if grpcCluster == nil {
		t.Fatalf("no cluster %q for the ext_proc grpc_service", clusterName)
	}
	var proto httpupstreamv3.HttpProtocolOptions
	if err := grpcCluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&proto); err != nil {
		t.Fatalf("cluster %s: no HttpProtocolOptions: %v", clusterName, err)
	}
	h2 := proto.GetExplicitHttpConfig().GetHttp2ProtocolOptions()
	if h2 == nil {
		t.Fatalf("cluster %s does not speak HTTP/2, which gRPC needs", clusterName)
	}
	// The limiter disconnects a peer pinging more often than every 5s.
	if ka := h2.GetConnectionKeepalive().GetInterval().AsDuration(); ka != 0 && ka < 5*time.Second {
		t.Errorf("connection_keepalive interval %s, want at least extproc.minPingInterval (5s)", ka)
	}
	hc := grpcCluster.GetHealthChecks()
	if len(hc) != 1 || hc[0].GetGrpcHealthCheck().GetServiceName() != extprocv3.ExternalProcessor_ServiceDesc.ServiceName {
		t.Errorf("health checks %v, want gRPC health of %s", hc, extprocv3.ExternalProcessor_ServiceDesc.ServiceName)
	}
}
