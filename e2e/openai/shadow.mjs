// Streams one chat completion with the official OpenAI Node SDK through
// limiter proxy, reading the HTTP response beside the stream
// (.withResponse()), and reports on stdout, one JSON line per event:
//   {"event":"sent"}                                  per HTTP request the
//       SDK made (its retries included)
//   {"event":"headers","status":N,"wouldRefuse":...,"streamId":...}
//       the response's status, X-Limiter-Would-Refuse (null when absent)
//       and X-Limiter-Stream-Id
//   {"event":"chunk","content":...}                   per chunk
//   {"event":"done","chunks":N}                       at the end
//   {"event":"error","name":...,"status":...,"code":...,"message":...}
//
// Environment (set by e2e/proxy_shadow_test.go):
//   BASE_URL   the proxy's /v1 URL
//   USER_ID    sent as X-User-Id
//   PLAN       sent as X-Plan
//   MODEL      the body's model: the key of pool "model"
//   STREAM     sent as X-Test-Stream: names the stream to the test upstream
import OpenAI from "openai";

const out = (event) => process.stdout.write(JSON.stringify({ t: Date.now(), ...event }) + "\n");

const headers = {};
if (process.env.USER_ID) headers["X-User-Id"] = process.env.USER_ID;
if (process.env.PLAN) headers["X-Plan"] = process.env.PLAN;
if (process.env.STREAM) headers["X-Test-Stream"] = process.env.STREAM;
const client = new OpenAI({
  baseURL: process.env.BASE_URL,
  apiKey: "unused",
  defaultHeaders: headers,
  fetch: async (url, init) => {
    out({ event: "sent" });
    return fetch(url, init);
  },
});

try {
  const { data: stream, response } = await client.chat.completions
    .create({
      model: process.env.MODEL,
      messages: [{ role: "user", content: "hi" }],
      stream: true,
    })
    .withResponse();
  out({
    event: "headers",
    status: response.status,
    wouldRefuse: response.headers.get("x-limiter-would-refuse"),
    streamId: response.headers.get("x-limiter-stream-id"),
  });
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
    status: err?.status ?? null,
    code: err?.code ?? null,
    message: String(err?.message ?? err),
  });
}
