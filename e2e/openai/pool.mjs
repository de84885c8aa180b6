// Streams one chat completion with the official OpenAI Node SDK through
// limiter proxy, whose pool "model" reads its key from the body's model
// field, and reports on stdout, one JSON line per event:
//   {"event":"sent","sha256":...,"bytes":...}   per HTTP request the SDK
//       made (its retries included), with the SHA-256 of the exact body
//       bytes it handed to fetch
//   {"event":"chunk","content":...}              per chunk
//   {"event":"done","chunks":N}                  at the end
//   {"event":"error","name":...,"rateLimit":bool,"status":...,"code":...,
//    "type":...,"pool":...,"key":...,"retryAfter":...,"shouldRetry":...}
//
// The body is one a proxy could not re-encode unnoticed: its fields are
// not in alphabetical order (messages and stream before model) and its
// content holds characters that encoders escape differently (<, >, &,
// U+2028, non-ASCII).
//
// Environment (set by e2e/proxy_pools_test.go):
//   BASE_URL   the proxy's /v1 URL
//   USER_ID    sent as X-User-Id
//   PLAN       sent as X-Plan
//   MODEL      the body's model: the key of pool "model"
//   STREAM     sent as X-Test-Stream: names the stream to the test upstream
//   PAD_BYTES  adds a user message of this many bytes ("x"s); default none
import { createHash } from "node:crypto";
import OpenAI from "openai";

const out = (event) => process.stdout.write(JSON.stringify({ t: Date.now(), ...event }) + "\n");

// The SDK's fetch, watched: what it sends is what the proxy must forward.
const watchedFetch = async (url, init) => {
  const body = init?.body;
  if (typeof body === "string" || body instanceof Uint8Array) {
    const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body);
    out({ event: "sent", sha256: createHash("sha256").update(bytes).digest("hex"), bytes: bytes.length });
  } else {
    out({ event: "sent", sha256: "", bytes: -1, bodyType: typeof body });
  }
  return fetch(url, init);
};

const headers = {};
if (process.env.USER_ID) headers["X-User-Id"] = process.env.USER_ID;
if (process.env.PLAN) headers["X-Plan"] = process.env.PLAN;
if (process.env.STREAM) headers["X-Test-Stream"] = process.env.STREAM;
const client = new OpenAI({
  baseURL: process.env.BASE_URL,
  apiKey: "unused",
  defaultHeaders: headers,
  fetch: watchedFetch,
  // The SDK's default retries: x-should-retry: false must stop them.
});

const body = {
  messages: [
    { role: "system", content: "Réponds <b>brièvement</b> & poliment\u2028merci 😀" },
    { role: "user", content: 'say "hi" \\ then stop' },
  ],
  stream: true,
  temperature: 0.5,
  model: process.env.MODEL,
  metadata: { z: "1", a: "2" },
};
const pad = Number(process.env.PAD_BYTES || 0);
if (pad > 0) body.messages.push({ role: "user", content: "x".repeat(pad) });

try {
  const stream = await client.chat.completions.create(body);
  let chunks = 0;
  for await (const chunk of stream) {
    out({ event: "chunk", content: chunk.choices[0]?.delta?.content ?? "" });
    chunks++;
  }
  out({ event: "done", chunks });
} catch (err) {
  out({
    event: "error",
    name: err?.constructor?.name,
    rateLimit: err instanceof OpenAI.RateLimitError,
    status: err?.status ?? null,
    code: err?.code ?? null,
    type: err?.type ?? null,
    pool: err?.error?.pool ?? null,
    key: err?.error?.key ?? null,
    retryAfter: err?.headers?.get?.("retry-after") ?? null,
    shouldRetry: err?.headers?.get?.("x-should-retry") ?? null,
    message: String(err?.message ?? err),
  });
}
