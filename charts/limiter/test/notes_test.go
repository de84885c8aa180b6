package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// renderNotes returns what `helm install` prints after NOTES: for the values
// files and flags. helm renders templates/NOTES.txt only on an install (or a
// --dry-run against a cluster), so this renders the same text with `helm
// template` from a copy of the chart in which NOTES.txt is the data of a
// ConfigMap.
func renderNotes(t *testing.T, valuesFiles []string, flags ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "limiter")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	templates := filepath.Join(dir, "templates")
	notes, err := os.ReadFile(filepath.Join(templates, "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(templates, "NOTES.txt")); err != nil {
		t.Fatal(err)
	}
	define := `{{- define "test.notes" }}` + string(notes) + `{{- end }}`
	if err := os.WriteFile(filepath.Join(templates, "_test_notes.tpl"), []byte(define), 0o644); err != nil {
		t.Fatal(err)
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: test-notes}\ndata:\n  notes: |\n{{ include \"test.notes\" . | indent 4 }}\n"
	if err := os.WriteFile(filepath.Join(templates, "zz_test_notes.yaml"), []byte(cm), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", release, dir, "--namespace", namespace, "--show-only", "templates/zz_test_notes.yaml"}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	out, stderr, err := runHelm(t, append(args, flags...)...)
	if err != nil {
		t.Fatalf("helm %v: %v\n%s", args, err, stderr)
	}
	objs := decode(t, out)
	text, _, _ := unstructured.NestedString(find(t, objs, "ConfigMap", "test-notes").Object, "data", "notes")
	return text
}

// What `helm install` prints tells the operator how to try what the pods
// run: in mode serve the slot API, with the generated caller's token, on
// the Service's port; in mode proxy (`limiter proxy`, which serves no slot
// API and reads no api.tokensFile) a request through the proxy on
// proxy.port, with the identity the proxy reads: the headers, which it
// trusts as they come, or a bearer JWT.
func TestNotesFitTheMode(t *testing.T) {
	readmeProxy := []string{ // the chart README's "Proxy mode" install
		"--set", "mode=proxy", "--set", "proxy.upstream=http://vllm.llm.svc:8000",
		"--set", "proxy.routes={/v1/chat/completions,/v1/completions}",
	}
	slotAPI := []string{"/v1/slots/", "Bearer $TOKEN", "api-tokens", "8080:8080"}
	tests := []struct {
		name   string
		files  []string
		flags  []string
		want   []string
		absent []string
	}{
		{
			name:  "mode serve",
			files: []string{redisValues},
			want: []string{
				"get secret limiter-api-tokens",
				"port-forward service/limiter 8080:8080",
				"curl -sS -X POST localhost:8080/v1/slots/acquire",
			},
			absent: []string{"/v1/chat/completions", "X-User-Id", "ca.crt", "https://"},
		},
		{
			name:  "mode serve, the admin API",
			files: []string{redisValues},
			flags: []string{"--set", "admin.existingSecret=limiter-admin"},
			want: []string{
				"port-forward service/limiter-admin 8081:8081",
				"open http://localhost:8081/admin/",
			},
			absent: []string{"https://localhost:8081", "served over TLS"},
		},
		{
			name:  "mode serve, the admin API over TLS",
			files: []string{redisValues},
			flags: []string{"--set", "admin.existingSecret=limiter-admin", "--set", "server.tls.existingSecret=limiter-tls"},
			want: []string{
				"port-forward service/limiter-admin 8081:8081",
				"open https://localhost:8081/admin/",
				"served over TLS, with the certificate of the Secret\nlimiter-tls",
			},
			absent: []string{"http://localhost:8081"},
		},
		{
			name:  "mode serve over TLS",
			files: []string{redisValues},
			flags: []string{"--set", "server.tls.existingSecret=limiter-tls"},
			want: []string{
				"port-forward service/limiter 8080:8080",
				"get secret limiter-tls -o jsonpath='{.data.ca\\.crt}' | base64 -d > ca.crt",
				"curl -sS --cacert ca.crt -X POST https://localhost:8080/v1/slots/acquire",
				"curl -sS --cacert ca.crt -X POST https://localhost:8080/v1/slots/heartbeat",
				"curl -sS --cacert ca.crt -X POST https://localhost:8080/v1/slots/release",
			},
			absent: []string{" localhost:8080/", "curl -sS -X POST"},
		},
		{
			name:  "mode proxy over TLS",
			files: []string{redisValues},
			flags: append(readmeProxy, "--set", "server.tls.existingSecret=limiter-tls"),
			want: []string{
				"port-forward service/limiter 8000:8000",
				"base64 -d > ca.crt",
				"curl -sS --cacert ca.crt -N https://localhost:8000/v1/chat/completions",
			},
			absent: append(slotAPI, " localhost:8000/"),
		},
		{
			name:  "mode proxy, identity from headers",
			files: []string{redisValues},
			flags: readmeProxy,
			want: []string{
				"port-forward service/limiter 8000:8000",
				"localhost:8000/v1/chat/completions",
				"-H 'X-User-Id: user-1' -H 'X-Plan: free'",
				"trusted as they come",
				"networkPolicy.api.from",
			},
			absent: append(slotAPI, "Authorization: Bearer"),
		},
		{
			name:  "mode proxy, other headers and port",
			files: []string{redisValues},
			flags: append(readmeProxy, "--set", "proxy.port=9000",
				"--set", "identity.userHeader=X-Caller", "--set", "identity.planHeader=X-Tier"),
			want: []string{
				"port-forward service/limiter 9000:9000",
				"localhost:9000/v1/chat/completions",
				"-H 'X-Caller: user-1' -H 'X-Tier: free'",
				"trusted as they come",
			},
			absent: append(slotAPI, "X-User-Id", "X-Plan"),
		},
		{
			name:  "mode proxy, a route other than chat completions",
			files: []string{redisValues},
			flags: []string{"--set", "mode=proxy", "--set", "proxy.upstream=http://vllm.llm.svc:8000",
				"--set", "proxy.routes={/v1/completions}"},
			want:   []string{"localhost:8000/v1/completions"},
			absent: append(slotAPI, "/v1/chat/completions"),
		},
		{
			name:  "mode proxy, identity from a JWT",
			files: []string{redisValues, proxyValues},
			want: []string{
				"port-forward service/limiter 8000:8000",
				"localhost:8000/v1/chat/completions",
				`-H "Authorization: Bearer $JWT"`,
				"https://auth.example.com",
			},
			absent: append(slotAPI, "X-User-Id", "trusted as they come"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notes := renderNotes(t, tt.files, tt.flags...)
			for _, want := range tt.want {
				if !strings.Contains(notes, want) {
					t.Errorf("the NOTES do not say %q", want)
				}
			}
			for _, bad := range tt.absent {
				if strings.Contains(notes, bad) {
					t.Errorf("the NOTES say %q, which does not apply", bad)
				}
			}
			if t.Failed() {
				t.Logf("NOTES:\n%s", notes)
			}
		})
	}
}

// `limiter proxy` reads no api.tokensFile: mode proxy renders no callers'
// Secret, no api.tokensFile in the config file and no volume for it.
func TestProxyModeHasNoCallerTokens(t *testing.T) {
	for _, tt := range []struct {
		name  string
		flags []string
	}{
		{"generated", nil},
		{"an existing Secret", []string{"--set", "api.existingSecret=limiter-callers"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, []string{redisValues, proxyValues}, tt.flags...)
			for _, s := range ofKind(objs, "Secret") {
				t.Errorf("mode proxy rendered the Secret %s", s.GetName())
			}
			if api, ok := configFile(t, objs)["api"]; ok {
				t.Errorf("mode proxy: config api %v, want no api section", api)
			}
			pod := podSpec(t, find(t, objs, "Deployment", ""))
			for _, m := range container(t, pod)["volumeMounts"].([]any) {
				if mm := m.(map[string]any); mm["name"] == "api-tokens" || mm["mountPath"] == "/etc/limiter/api" {
					t.Errorf("mode proxy mounts %v", mm)
				}
			}
			for _, v := range pod["volumes"].([]any) {
				if vm := v.(map[string]any); vm["name"] == "api-tokens" {
					t.Errorf("mode proxy has the volume %v", vm)
				}
			}
		})
	}
}
