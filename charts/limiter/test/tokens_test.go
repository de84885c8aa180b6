package chart

import (
	"context"
	"encoding/base64"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// generatedTokens is the tokens file the chart generates: one caller,
// "default", allowed every plan, with a random 32-character token.
var generatedTokens = regexp.MustCompile(`^default [A-Za-z0-9]{32} \*\n$`)

// The callers' tokens file is a Secret mounted as a directory and named by
// api.tokensFile; the chart generates it unless api.existingSecret names
// one. helm template cannot look the cluster up, so each render generates
// a new token (TestInstallKeepsCallerTokens checks that an upgrade keeps
// the one installed).
func TestCallerTokens(t *testing.T) {
	t.Run("generated", func(t *testing.T) {
		objs := render(t, []string{redisValues})
		first := secretFile(t, find(t, objs, "Secret", "limiter-api-tokens"), "tokens")
		if !generatedTokens.MatchString(first) {
			t.Errorf("generated tokens file: got %q, want one line \"default <32 letters and digits> *\"", first)
		}
		again := secretFile(t, find(t, render(t, []string{redisValues}), "Secret", "limiter-api-tokens"), "tokens")
		if again == first {
			t.Errorf("two renders generated the same token %q, want a random one each", first)
		}
		checkTokensMounted(t, objs, "limiter-api-tokens", "tokens")
	})
	t.Run("an existing Secret", func(t *testing.T) {
		objs := render(t, []string{redisValues}, "--set", "api.existingSecret=limiter-callers", "--set", "api.key=callers.txt")
		if n := len(ofKind(objs, "Secret")); n != 0 {
			t.Errorf("rendered %d Secrets with api.existingSecret, want 0", n)
		}
		checkTokensMounted(t, objs, "limiter-callers", "callers.txt")
	})
}

// checkTokensMounted fails unless the pod mounts key of the Secret name as
// the file that the config's api.tokensFile names.
func checkTokensMounted(t *testing.T, objs []*unstructured.Unstructured, name, key string) {
	t.Helper()
	pod := podSpec(t, find(t, objs, "Deployment", ""))
	var mountPath string
	for _, m := range container(t, pod)["volumeMounts"].([]any) {
		if mm := m.(map[string]any); mm["name"] == "api-tokens" {
			mountPath, _ = mm["mountPath"].(string)
			if mm["subPath"] != nil {
				t.Errorf("the tokens are mounted with subPath, so an edited Secret would never reach the pod")
			}
		}
	}
	var secretName, item string
	for _, v := range pod["volumes"].([]any) {
		if vm := v.(map[string]any); vm["name"] == "api-tokens" {
			secretName, _, _ = unstructured.NestedString(vm, "secret", "secretName")
			items, _, _ := unstructured.NestedSlice(vm, "secret", "items")
			if len(items) == 1 && items[0].(map[string]any)["key"] == key {
				item, _ = items[0].(map[string]any)["path"].(string)
			}
		}
	}
	if secretName != name || item == "" || mountPath == "" {
		t.Fatalf("api-tokens volume: Secret %q, key %q mounted as %q in %q; want Secret %q, key %q", secretName, key, item, mountPath, name, key)
	}
	got := configFile(t, objs)["api"].(map[string]any)["tokensFile"]
	if want := mountPath + "/" + item; got != want {
		t.Errorf("config api.tokensFile: got %v, want the mounted file %s", got, want)
	}
}

// A real install generates the callers' Secret, and upgrades keep it byte
// for byte, an operator's edit included: helm's lookup reads it back from
// the API server. The NOTES tell a caller how to get its token.
func TestInstallKeepsCallerTokens(t *testing.T) {
	api := sharedAPIServer(t)
	const ns = "limiter-install"
	api.apply(t, restrictedNamespace(ns), false)
	helm := func(args ...string) string {
		t.Helper()
		args = append(args, "--kubeconfig", api.kubeconfig, "--namespace", ns)
		out, stderr, err := runHelm(t, args...)
		if err != nil {
			t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
		}
		return out
	}
	secret := &unstructured.Unstructured{}
	secret.SetAPIVersion("v1")
	secret.SetKind("Secret")
	secret.SetNamespace(ns)
	secret.SetName("limiter-api-tokens")
	tokens := func() string {
		t.Helper()
		return secretFile(t, api.get(t, secret), "tokens")
	}

	notes := helm("install", release, chartDir, "--values", redisValues)
	installed := tokens()
	if !generatedTokens.MatchString(installed) {
		t.Fatalf("installed tokens file: got %q, want one generated caller", installed)
	}
	wantCmd := `kubectl -n ` + ns + ` get secret limiter-api-tokens -o jsonpath='{.data.tokens}' | base64 -d | awk '$1 == "default" {print $2}'`
	if !strings.Contains(notes, wantCmd) {
		t.Errorf("the NOTES do not show how to get the token (%s):\n%s", wantCmd, notes)
	}

	helm("upgrade", release, chartDir, "--values", redisValues, "--set", "log.level=debug")
	if got := tokens(); got != installed {
		t.Errorf("after an upgrade: got tokens %q, want those installed %q", got, installed)
	}

	// An operator adds a caller with kubectl; the next upgrade keeps it.
	edited := installed + "gateway 0123456789abcdef0123456789abcdef free,paid\n"
	live := api.get(t, secret)
	if err := unstructured.SetNestedField(live.Object, base64.StdEncoding.EncodeToString([]byte(edited)), "data", "tokens"); err != nil {
		t.Fatal(err)
	}
	res, err := api.resource(live)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := res.Update(ctx, live, metav1.UpdateOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatalf("editing the Secret: %v", err)
	}
	helm("upgrade", release, chartDir, "--values", redisValues, "--set", "log.level=info")
	if got := tokens(); got != edited {
		t.Errorf("after an edit and an upgrade: got tokens %q, want the edited %q", got, edited)
	}
}

// secretFile returns the decoded data[key] of a Secret.
func secretFile(t *testing.T, secret *unstructured.Unstructured, key string) string {
	t.Helper()
	enc, found, _ := unstructured.NestedString(secret.Object, "data", key)
	if !found {
		t.Fatalf("Secret %s has no data[%q]", secret.GetName(), key)
	}
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatalf("Secret %s data[%q]: %v", secret.GetName(), key, err)
	}
	return string(b)
}
