package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
)

// The documents whose commands TestReadmeCommands runs: the README and
// every page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoDir(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(pages)
	return append([]string{filepath.Join(repoDir(t), "README.md")}, pages...)
}

// How TestReadmeCommands treats a command of the docs.
type docHow int

const (
	// docRun runs the command in bash and wants exit 0 and, in its output,
	// every docSpec.want and what the document shows of the answer.
	docRun docHow = iota
	// docServe starts a long-running server (serve, proxy) and waits until
	// its ops listener is ready; it is killed at the end.
	docServe
	// docBackground starts the command and leaves it running (a stream that
	// must stay open for the next command); it is killed at the end.
	docBackground
	// docNotRun: the command cannot run here; docSpec.why says why.
	docNotRun
)

type docSpec struct {
	how  docHow
	want []string // substrings of the output (docRun)
	why  string   // why the command is not run (docNotRun)
	// early starts a docRun command when the test starts, beside the
	// others, for one that needs no server and takes long (a build).
	early bool
	// callers runs the command against a serve with api.tokensFile,
	// whose caller's token is LIMITER_TOKEN, instead of the document's.
	callers bool
}

// notRunHere are the reasons shared by the commands that need what the
// test machines do not have.
const (
	needsCluster  = "needs a Kubernetes cluster; the chart is rendered and linted by charts/limiter/test, the manifests applied to a real kube-apiserver by the envtest tests"
	needsDocker   = "needs a container engine, which the test machines do not have; the Dockerfile was checked by reading it against charts/limiter/templates/deployment.yaml (entrypoint /limiter, USER 65532, no file written)"
	needsRegistry = "needs a container engine and a registry to push to"
)

// docSpecs holds every command of README.md and docs/*.md, by its text
// (continuation lines joined, trailing comment and extra spaces dropped).
// A command missing here fails the test: run it, or say why it cannot run.
var docSpecs = map[string]docSpec{
	// README.md: the two commands at its top.
	`go run ./cmd/limiter serve`: {how: docServe},
	`make test`:                  {how: docNotRun, why: "it is the suite that runs this test (and takes minutes)"},
	// README.md: Try it, on the serve above.
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"ana","plan":"free","stream_id":"chat-1"}'`:   {},
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/heartbeat -d '{"user_id":"ana","plan":"free","stream_id":"chat-1"}'`: {},
	`curl -si -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"ana","plan":"free"}'`:                       {want: []string{"Retry-After:"}},
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/release -d '{"user_id":"ana","stream_id":"chat-1"}'`:                 {},
	// README.md: the clients' install lines.
	`go get github.com/joishi/limiter/pkg/client`: {how: docNotRun, why: "the module this test is part of; pkg/client's own tests import it"},
	`pip install ./clients/python`:                {how: docNotRun, why: "TestPythonClientInstall runs it in a fresh virtual environment (no Python registry here: --no-index --no-build-isolation, with Debian's setuptools)"},
	`npm install ./clients/typescript`:            {how: docNotRun, why: "TestTypeScriptClientInstall runs it from a fresh project and imports the built package"},
	// README.md: artifacts.
	`make build`:               {early: true},
	`go install ./cmd/limiter`: {early: true},
	`docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t registry.example.com/limiter:0.1.0 .`: {how: docNotRun, why: needsDocker},
	`docker push registry.example.com/limiter:0.1.0`: {how: docNotRun, why: needsRegistry},
	`helm install limiter charts/limiter --namespace limiter --create-namespace --set image.repository=registry.example.com/limiter --set image.tag=0.1.0 --set 'redis.addrs={redis-cluster-0.redis:6379,redis-cluster-1.redis:6379}'`: {how: docNotRun, why: needsCluster},
	// README.md: turning a cap on (docs/configuration.md runs shadow mode
	// on a file config; the envtest tests switch a LimitTier's enforce).
	`kubectl -n limiter patch lt free --type merge -p '{"spec":{"enforce":true}}'`: {how: docNotRun, why: needsCluster},
	// README.md: the proxy, in front of a test upstream that streams until
	// the test ends, with the pool "model" keyed by the body's model (its
	// key "big" capped at 1): the user's cap, then the pool's.
	`env LIMITER_POOLS_STATIC='[{"pool":"model","keys":{"big":1}}]' LIMITER_IDENTITY_POOLS=model=body:model go run ./cmd/limiter proxy --upstream http://my-llm:8000`:                                                   {how: docServe},
	`curl -N localhost:8000/v1/chat/completions -H 'X-User-Id: ana' -H 'X-Plan: free' -H 'Content-Type: application/json' -d '{"model":"small","stream":true,"messages":[{"role":"user","content":"Count to 1000."}]}'`: {how: docBackground},
	`curl -i localhost:8000/v1/chat/completions -H 'X-User-Id: ana' -H 'X-Plan: free' -H 'Content-Type: application/json' -d '{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}'`:             {want: []string{"429", "X-Should-Retry: false", `"code":"stream_limit_reached"`}},
	`curl -N localhost:8000/v1/chat/completions -H 'X-User-Id: bo' -H 'X-Plan: paid' -H 'Content-Type: application/json' -d '{"model":"big","stream":true,"messages":[{"role":"user","content":"Count to 1000."}]}'`:    {how: docBackground},
	`curl -i localhost:8000/v1/chat/completions -H 'X-User-Id: cy' -H 'X-Plan: paid' -H 'Content-Type: application/json' -d '{"model":"big","stream":true,"messages":[{"role":"user","content":"hi"}]}'`: {want: []string{"429", "Retry-After:", "X-Should-Retry: false",
		`"type":"rate_limit_error"`, `"code":"pool_limit_reached"`, `"pool":"model"`, `"key":"big"`}},
	// README.md: the pool's 429 through Envoy AI Gateway.
	`curl -i https://llm.example.com/v1/chat/completions -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d '{"model":"big","stream":true,"messages":[{"role":"user","content":"hi"}]}'`: {how: docNotRun,
		why: "needs Envoy and Envoy AI Gateway, which cannot run here; pkg/extproc's tests play the filter's messages (pool keys from headers and from a buffered body), and the answer is the 429 the proxy's command above shows"},
	// README.md and docs/envoy.md: the ext_proc server.
	`limiter serve --extproc-addr :9091`: {how: docServe},
	// README.md and docs/envoy.md: Helm.
	`helm install limiter charts/limiter --namespace limiter --create-namespace --set 'redis.addrs={redis-cluster-0.redis:6379,redis-cluster-1.redis:6379}'`:                                 {how: docNotRun, why: needsCluster},
	`kubectl -n limiter get secret limiter-api-tokens -o jsonpath='{.data.tokens}' | base64 -d | awk '$1 == "default" {print $2}'`:                                                           {how: docNotRun, why: needsCluster},
	`helm upgrade --install limiter charts/limiter --namespace limiter --reuse-values --set extproc.enabled=true --set server.tls.existingSecret=limiter-tls --set server.tls.clientCA=true`: {how: docNotRun, why: needsCluster},
	// docs/configuration.md: LimitTier objects.
	`kubectl apply -k config/crd`:                {how: docNotRun, why: needsCluster},
	`kubectl apply -k config/rbac`:               {how: docNotRun, why: needsCluster},
	`kubectl apply -n limiter -k config/samples`: {how: docNotRun, why: needsCluster},
	`kubectl get lt -n limiter -o wide`:          {how: docNotRun, why: needsCluster},
	// docs/admin.md and docs/runbook.md: the admin CLI, on the docs' serve
	// (admin tokens, the pool model with gpt-4o capped).
	`export LIMITER_ADMIN_URL=http://HOST:8081 LIMITER_ADMIN_TOKEN=...`:                         {},
	`export LIMITER_ADMIN_URL=http://<limiter admin listener>:8081 LIMITER_ADMIN_TOKEN=<token>`: {},
	`limiter admin slots USER`:                          {want: []string{"user USER:"}},
	`limiter admin release USER --reason "ticket 4812"`: {},
	`limiter admin override set USER --max-streams 5 --expires-in 24h --reason "ticket 4812: launch day"`: {},
	`limiter admin override remove USER --reason "ticket 4812: plan upgraded"`:                            {},
	`limiter admin pool model gpt-4o`: {want: []string{"pool key model=gpt-4o:"}},
	`limiter admin pool-override set model gpt-4o --max-streams 600 --expires-in 4h --reason "ticket 4900: launch"`: {},
	`limiter admin pool-override remove model gpt-4o --reason "ticket 4900: launch over"`:                           {},
	`limiter admin audit`:         {want: []string{"set_override", "model=gpt-4o"}},
	`limiter admin slots user-42`: {want: []string{"user user-42:"}},
	`limiter admin release user-42 --reason "ticket 4812: hung worker gen2/worker-7"`:                        {},
	`limiter admin override set user-42 --max-streams 5 --expires-in 24h --reason "ticket 4812: launch day"`: {},
	`limiter admin override remove user-42 --reason "ticket 4812: plan upgraded"`:                            {},
	// docs/api.md: waiting, and a caller's token, on the docs' serve.
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"ana","plan":"paid","wait_ms":10000}'`:                           {},
	`curl -s -H "Authorization: Bearer $LIMITER_TOKEN" -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"ana","plan":"free"}'`: {callers: true, want: []string{`"granted":true`}},
	// docs/api.md: each plan's enforce, trial's false (docsServeConfig).
	`curl -s localhost:8080/v1/tiers`: {want: []string{`"plan":"trial"`, `"enforce":false`, `"enforce":true`}},
	// docs/configuration.md: the plan trial (1 stream) in shadow mode: eve's
	// second stream is granted, counted and said to be one it would refuse.
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"eve","plan":"trial","stream_id":"eve-1"}'`: {want: []string{`"used":1,"limit":1`}},
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"eve","plan":"trial","stream_id":"eve-2"}'`: {want: []string{`"used":2,"limit":1`, `"would_refuse":"stream_limit_reached"`}},
	`curl -s localhost:9090/metrics | grep 'outcome="shadow_refused",plan="trial"'`:                                                                {want: []string{`limiter_acquire_total{`, `outcome="shadow_refused",plan="trial"} 1`}},
	`limiter admin slots eve`: {want: []string{"user eve: 2 live slots\nlimit: plan trial allows 1 (shadow - not enforced"}},
	// docs/pools.md: the pool provider (openai capped at 1) in shadow mode.
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"fay","plan":"paid","pools":{"provider":"openai"}}'`: {want: []string{`"pools":[{"pool":"provider","key":"openai","used":1,"limit":1}]`}},
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"gus","plan":"paid","pools":{"provider":"openai"}}'`: {want: []string{`"pools":[{"pool":"provider","key":"openai","used":2,"limit":1}]`,
		`"would_refuse":"pool_limit_reached","would_refuse_by":{"pool":"provider","key":"openai","used":2,"limit":1}`}},
	`limiter admin pool provider openai`: {want: []string{"pool key provider=openai: 2 live memberships, the pool's cap 1 (shadow - not enforced"}},
	// docs/pools.md: the pool model's key gpt-4o, capped at 1.
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"ana","plan":"paid","pools":{"model":"gpt-4o"}}'`: {want: []string{`"pools":[{"pool":"model","key":"gpt-4o","used":1,"limit":1}]`}},
	`curl -s -H 'Content-Type: application/json' -XPOST localhost:8080/v1/slots/acquire -d '{"user_id":"bo","plan":"paid","pools":{"model":"gpt-4o"}}'`:  {},
}

// docsServeConfig is the serve the commands of docs/*.md run against: the
// default plans and the plan trial in shadow mode (docs/configuration.md),
// the pools of docs/pools.md (provider in shadow mode) and an admin
// listener. README.md's run against the serve its own command starts.
const docsServeConfig = `tiers:
  static:
    - {plan: free, maxConcurrentStreams: 1}
    - {plan: paid, maxConcurrentStreams: 3, maxWait: 10s}
    - {plan: trial, maxConcurrentStreams: 1, enforce: false}
pools:
  static:
    - pool: model
      maxConcurrentStreams: 100
      keys: {gpt-4o: 1, meta-llama/Llama-3.1-70B-Instruct: 64}
    - {pool: provider, keys: {openai: 1}, enforce: false}
admin:
  tokensFile: %s
`

// TestReadmeCommands runs the commands of README.md and docs/*.md as a
// reader would, in the order they are written: the servers they start
// (`go run ./cmd/limiter` is the binary servetest builds of it, on free
// ports given as LIMITER_*_ADDR), the curl calls against them (the
// documents' localhost:8080, :9090 and :8000 rewritten to those ports), the admin
// CLI on PATH, the builds. What a document shows of an answer (an HTTP
// status, a "code", "granted") must be in the output. Commands that need a
// cluster or a container engine are listed in docSpecs with the reason.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	bin := servetest.Binary(t)
	root := repoDir(t)
	tmp := t.TempDir()
	adminToken := "docs-operator-" + randomID()
	adminTokens := filepath.Join(tmp, "admin-tokens")
	if err := os.WriteFile(adminTokens, []byte("docs operator "+adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	callerToken := "docs-caller-token-" + randomID()
	callerTokens := filepath.Join(tmp, "api-tokens")
	if err := os.WriteFile(callerTokens, []byte("docs-caller "+callerToken+" free,paid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	docsServe := servetest.Start(t, servetest.Options{Config: fmt.Sprintf(docsServeConfig, adminTokens)})
	callersServe := servetest.Start(t, servetest.Options{Config: "api:\n  tokensFile: " + callerTokens + "\n"})
	upstream := streamingUpstream(t)

	quickAPI, proxyAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	env := append(os.Environ(),
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GOBIN="+filepath.Join(tmp, "gobin"),
		"LIMITER_ADMIN_URL="+docsServe.Admin, "LIMITER_ADMIN_TOKEN="+adminToken,
		"LIMITER_TOKEN="+callerToken)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	run := func(script string) (string, error) {
		cmd := exec.CommandContext(ctx, "bash", "-c", script)
		cmd.Dir, cmd.Env = root, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	type result struct {
		out string
		err error
	}
	early := map[string]chan result{}
	for text, spec := range docSpecs {
		if spec.early {
			done := make(chan result, 1)
			early[text] = done
			go func() {
				out, err := run(text)
				done <- result{out, err}
			}()
		}
	}
	defer func() {
		for _, done := range early {
			<-done // no build outlives the test
		}
	}()
	seen := map[string]bool{}
	for _, file := range docFiles(t) {
		api, ops := strings.TrimPrefix(docsServe.API, "http://"), strings.TrimPrefix(docsServe.Ops, "http://")
		if filepath.Base(file) == "README.md" {
			api, ops = quickAPI, "" // no README command reads the metrics
		}
		rewrite := strings.NewReplacer(
			"go run ./cmd/limiter", bin,
			"localhost:8080", api,
			"localhost:9090", ops,
			"localhost:8000", proxyAddr,
			"http://my-llm:8000", upstream.URL,
			"http://HOST:8081", docsServe.Admin,
			"http://<limiter admin listener>:8081", docsServe.Admin,
			"LIMITER_ADMIN_TOKEN=<token>", "LIMITER_ADMIN_TOKEN="+adminToken,
			"LIMITER_ADMIN_TOKEN=...", "LIMITER_ADMIN_TOKEN="+adminToken,
			"--extproc-addr :9091", "--extproc-addr "+testenv.FreeAddr(t),
		)
		for _, c := range docCommandsOf(t, file) {
			spec, ok := docSpecs[c.text]
			where := fmt.Sprintf("%s:%d", rel(root, c.file), c.line)
			if !ok {
				t.Errorf("%s: command %q is not in docSpecs: run it there, or list it as docNotRun with the reason", where, c.text)
				continue
			}
			seen[c.text] = true
			script := rewrite.Replace(c.text)
			if spec.callers {
				script = strings.ReplaceAll(script, api, strings.TrimPrefix(callersServe.API, "http://"))
			}
			switch spec.how {
			case docNotRun:
				t.Logf("%s: not run (%s): %s", where, spec.why, c.text)
			case docServe:
				startDocServer(t, ctx, where, script, root, env, quickAPI, proxyAddr)
			case docBackground:
				startDocBackground(t, ctx, where, script, root, env, upstream)
			case docRun:
				var out string
				var err error
				if done, ok := early[c.text]; ok {
					r := <-done
					done <- r // a command written twice reads the one run
					out, err = r.out, r.err
				} else {
					out, err = run(script)
				}
				if err != nil {
					t.Errorf("%s: %s: %v\n%s", where, c.text, err, out)
					continue
				}
				for _, want := range append(spec.want, shownOf(c.output)...) {
					if !strings.Contains(out, want) {
						t.Errorf("%s: %s\ngot %s\nwant it to contain %q", where, c.text, out, want)
					}
				}
			}
		}
	}
	for text := range docSpecs {
		if !seen[text] {
			t.Errorf("docSpecs lists %q, which no document holds any more: remove it", text)
		}
	}
}

// startDocServer runs a server command of the docs with its listeners on
// free ports and waits until its ops listener is ready.
func startDocServer(t *testing.T, ctx context.Context, where, script, dir string, env []string, api, proxyAddr string) {
	t.Helper()
	ops := testenv.FreeAddr(t)
	cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+script)
	cmd.Dir = dir
	cmd.Env = append(env, "LIMITER_OPS_ADDR="+ops, "LIMITER_ADMIN_ADDR="+testenv.FreeAddr(t))
	if strings.Contains(script, " proxy ") {
		cmd.Env = append(cmd.Env, "LIMITER_PROXY_LISTEN="+proxyAddr)
	} else {
		cmd.Env = append(cmd.Env, "LIMITER_HTTP_ADDR="+api)
		if strings.Contains(script, "--extproc-addr") {
			cmd.Env[len(cmd.Env)-1] = "LIMITER_HTTP_ADDR=" + testenv.FreeAddr(t)
		}
	}
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if status, _ := servetest.Get("http://" + ops + "/readyz"); status == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s: not ready within 20s\n%s", where, script, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startDocBackground starts a stream through the proxy and waits until the
// upstream has it open.
func startDocBackground(t *testing.T, ctx context.Context, where, script, dir string, env []string, upstream *docUpstream) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+script)
	cmd.Dir, cmd.Env = dir, env
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	select {
	case <-upstream.streaming:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: %s: the upstream saw no stream within 10s\n%s", where, script, out.String())
	}
}

// docUpstream stands for the README's my-llm:8000: each request is a
// server-sent event stream that stays open until the test ends. As an
// OpenAI-compatible server (vLLM's) does, it answers a body that is not
// application/json 415 and a chat without messages 400, so a command
// that would fail against one fails here too.
type docUpstream struct {
	*httptest.Server
	streaming chan struct{}
}

func streamingUpstream(t *testing.T) *docUpstream {
	t.Helper()
	u := &docUpstream{streaming: make(chan struct{}, 16)}
	stop := make(chan struct{})
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			http.Error(w, `{"error":"Unsupported Media Type: Only 'application/json' is allowed"}`, http.StatusUnsupportedMediaType)
			return
		}
		var chat struct {
			Messages []json.RawMessage `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&chat); err != nil || len(chat.Messages) == 0 {
			http.Error(w, `{"error":"a chat completion needs messages"}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		u.streaming <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(u.Close)
	t.Cleanup(func() { close(stop) })
	return u
}

// docCommand is one command of a shell or console block, with what the
// document shows it prints (console blocks only).
type docCommand struct {
	file   string
	line   int
	text   string
	output string
}

// shellLangs are the fence languages whose lines are commands.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

// docCommandsOf extracts the commands of file's sh, bash, shell and console
// blocks. In a console block a command starts with "$ " and the lines up
// to the next are its output; elsewhere every line that is not a comment is
// a command. A trailing backslash continues a command on the next line.
func docCommandsOf(t *testing.T, file string) []docCommand {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []docCommand
	lang, inBlock := "", false
	var cur *docCommand
	pending := false // cur's last line ended with a backslash
	flush := func() {
		if cur != nil {
			cur.text = normalizeCommand(cur.text)
			cmds = append(cmds, *cur)
			cur = nil
		}
	}
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		if strings.HasPrefix(line, "```") {
			if inBlock {
				flush()
				inBlock = false
			} else {
				inBlock, lang = true, strings.TrimSpace(strings.TrimPrefix(line, "```"))
			}
			continue
		}
		if !inBlock || !shellLangs[lang] {
			continue
		}
		switch {
		case pending:
			cur.text += " " + line
		case lang == "console" && strings.HasPrefix(line, "$ "):
			flush()
			cur = &docCommand{file: file, line: i + 1, text: strings.TrimPrefix(line, "$ ")}
		case lang == "console":
			if cur != nil {
				cur.output += line + "\n"
			}
			continue
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		default:
			flush()
			cur = &docCommand{file: file, line: i + 1, text: line}
		}
		pending = strings.HasSuffix(line, `\`)
		if pending {
			cur.text = strings.TrimSuffix(cur.text, `\`)
		}
	}
	flush()
	return cmds
}

// normalizeCommand drops a trailing comment (a # after a space, outside
// quotes) and collapses runs of spaces.
func normalizeCommand(s string) string {
	var quote rune
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && i > 0 && s[i-1] == ' ':
			return strings.Join(strings.Fields(s[:i]), " ")
		}
	}
	return strings.Join(strings.Fields(s), " ")
}

// shownOf is what a console block shows of an answer, to be found in the
// real one: the HTTP status line's code and the "code", "granted", "alive"
// and "released" fields of a JSON body. Values that change from run to run
// (ids, times, counts) are left out.
var shownFields = regexp.MustCompile(`HTTP/1\.1 \d{3}|"(code|granted|alive|released)":("[^"]*"|true|false)`)

func shownOf(output string) []string {
	var shown []string
	for _, m := range shownFields.FindAllString(output, -1) {
		shown = append(shown, strings.TrimPrefix(m, "HTTP/1.1 "))
	}
	return shown
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}

// repoDir is the repository root: the parent of e2e/.
func repoDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
