// Streams one chat completion with the official OpenAI Node SDK, as an
// application would, and reports on stdout, one JSON line per event, what
// the SDK gave it: {"event":"chunk","content":...} per chunk,
// {"event":"done"} at the end, {"event":"aborted"} after an abort, or
// {"event":"error","name":...,"status":...,"code":...,"type":...}.
//
// Environment (set by e2e/proxy_openai_test.go):
//   BASE_URL     the proxy's /v1 URL
//   API_KEY      the bearer token (a JWT, or anything in header mode)
//   USER_ID      sent as X-User-Id unless empty
//   PLAN         sent as X-Plan unless empty
//   MODEL        tells the test upstream how to stream
//   ABORT_AFTER  abort (AbortController) after this many chunks; 0: never
import OpenAI from "openai";

const out = (event) => process.stdout.write(JSON.stringify({ t: Date.now(), ...event }) + "\n");

const headers = {};
if (process.env.USER_ID) headers["X-User-Id"] = process.env.USER_ID;
if (process.env.PLAN) headers["X-Plan"] = process.env.PLAN;
const client = new OpenAI({
  baseURL: process.env.BASE_URL,
  apiKey: process.env.API_KEY || "unused",
  defaultHeaders: headers,
  // The SDK's defaults: 2 retries, and its own reading of Retry-After and
  // x-should-retry, which the test checks.
});
const abortAfter = Number(process.env.ABORT_AFTER || 0);
const controller = new AbortController();

try {
  const stream = await client.chat.completions.create(
    { model: process.env.MODEL || "fast", stream: true, messages: [{ role: "user", content: "hello" }] },
    { signal: controller.signal },
  );
  let chunks = 0;
  for await (const chunk of stream) {
    out({ event: "chunk", content: chunk.choices[0]?.delta?.content ?? "" });
    chunks++;
    if (abortAfter > 0 && chunks >= abortAfter) {
      controller.abort();
      out({ event: "aborted" });
      // Stay alive a moment, as an application would: the abort alone,
      // not the process exiting, must free the slot.
      await new Promise((resolve) => setTimeout(resolve, 3000));
      process.exit(0);
    }
  }
  out({ event: "done", chunks });
} catch (err) {
  if (controller.signal.aborted) {
    out({ event: "aborted" });
    await new Promise((resolve) => setTimeout(resolve, 3000));
    process.exit(0);
  }
  out({
    event: "error",
    name: err?.constructor?.name,
    status: err?.status ?? null,
    code: err?.code ?? null,
    type: err?.type ?? null,
    message: String(err?.message ?? err),
  });
  process.exit(0);
}
