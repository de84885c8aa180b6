// What the tests share: the servers e2e/clients_test.go started, a
// recording server for request encoding, and a fault proxy that loses
// answers on their way back from a real serve.

import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { request as httpsRequest } from "node:https";
import type { AddressInfo } from "node:net";

import type { Logger } from "../src/index.js";

/** Whether the test command demands the real servers (make test sets LIMITER_TEST_REQUIRE=1). */
export function required(): boolean {
  return ["1", "true"].includes((process.env.LIMITER_TEST_REQUIRE ?? "").toLowerCase());
}

/**
 * The environment e2e/clients_test.go sets, or a reason to skip: missing,
 * it throws under LIMITER_TEST_REQUIRE=1 (the suite fails) and skips
 * otherwise.
 */
export function serveEnv<const N extends string>(...names: N[]): { env: Record<N, string>; skip: string | false } {
  const env = {} as Record<N, string>;
  const absent = names.filter((n) => !process.env[n]);
  for (const n of names) {
    env[n] = process.env[n] ?? "";
  }
  if (absent.length === 0) {
    return { env, skip: false };
  }
  const message = `${absent.join(", ")} not set: run the suite through \`make test\` (e2e/clients_test.go starts the servers)`;
  if (required()) {
    throw new Error(message);
  }
  return { env, skip: message };
}

/** A user id no other test uses. */
export function user(prefix = "ts"): string {
  return `${prefix}-${randomBytes(5).toString("hex")}`;
}

/** A logger that keeps what it is told, for tests to read. */
export class MemoryLogger implements Logger {
  readonly lines: string[] = [];
  info(message: string): void {
    this.lines.push("INFO " + message);
  }
  warn(message: string): void {
    this.lines.push("WARN " + message);
  }
  error(message: string): void {
    this.lines.push("ERROR " + message);
  }
}

/** The samples of a serve's /metrics, by series. */
export async function scrape(opsURL: string): Promise<Map<string, number>> {
  const text = await (await fetch(opsURL + "/metrics")).text();
  const samples = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line && !line.startsWith("#")) {
      const at = line.lastIndexOf(" ");
      samples.set(line.slice(0, at), Number(line.slice(at + 1)));
    }
  }
  return samples;
}

/** The sum of name's samples whose labels include labels. */
export function total(samples: Map<string, number>, name: string, labels: Record<string, string> = {}): number {
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  let sum = 0;
  for (const [series, value] of samples) {
    if ((series === name || series.startsWith(name + "{")) && want.every((w) => series.includes(w))) {
      sum += value;
    }
  }
  return sum;
}

/** One request a test server received. */
export interface Recorded {
  /** When it arrived (performance.now()). */
  at: number;
  method: string;
  path: string;
  headers: IncomingMessage["headers"];
  body: string;
  json: any; // parsed: the tests read back what they sent
}

/** An answer: status, headers, body; undefined drops the connection unanswered. */
export type Answer = { status: number; headers?: Record<string, string>; body: string } | undefined;

export function jsonAnswer(status: number, body: unknown, headers: Record<string, string> = {}): Answer {
  return { status, headers: { "Content-Type": "application/json", ...headers }, body: JSON.stringify(body) };
}

/** A local HTTP server answering with handle, recording every request. */
export class TestServer {
  readonly requests: Recorded[] = [];
  private readonly server: Server;
  url = "";

  constructor(private readonly handle: (rec: Recorded) => Promise<Answer> | Answer) {
    this.server = createServer((req, res) => void this.serve(req, res));
  }

  static async start(handle: (rec: Recorded) => Promise<Answer> | Answer): Promise<TestServer> {
    const s = new TestServer(handle);
    await new Promise<void>((resolve) => s.server.listen(0, "127.0.0.1", resolve));
    s.url = `http://127.0.0.1:${(s.server.address() as AddressInfo).port}`;
    return s;
  }

  received(path: string): Recorded[] {
    return this.requests.filter((r) => r.path.split("?")[0] === path);
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const at = performance.now();
    const chunks: Buffer[] = [];
    for await (const chunk of req) {
      chunks.push(chunk as Buffer);
    }
    const body = Buffer.concat(chunks).toString("utf8");
    const rec: Recorded = { at, method: req.method ?? "", path: req.url ?? "", headers: req.headers, body, json: body ? JSON.parse(body) : undefined };
    this.requests.push(rec);
    const answer = await this.handle(rec);
    if (answer === undefined) {
      req.socket.destroy();
      return;
    }
    res.writeHead(answer.status, answer.headers ?? {});
    res.end(answer.body);
  }
}

/**
 * Forwards every request to a real serve and passes its answer back, except
 * for the faults queued per path: "503" forwards the request (the slot is
 * taken in Redis) and answers 503 limiter_unavailable, naming the stream id
 * as serve does, in place of serve's answer; "drop" forwards it and closes
 * the connection without an answer; "late" answers that 503 at once and
 * forwards the request FaultProxy.lateMs later (an attempt that reaches
 * Redis after the client gave it up and released its id).
 */
export class FaultProxy {
  static readonly lateMs = 300;

  private readonly faults = new Map<string, string[]>();

  private constructor(readonly server: TestServer) {}

  static async start(upstream: string): Promise<FaultProxy> {
    let proxy: FaultProxy | undefined;
    const server = await TestServer.start(async (rec) => {
      const headers: Record<string, string> = {};
      for (const name of ["content-type", "authorization", "accept"]) {
        const v = rec.headers[name];
        if (typeof v === "string") {
          headers[name] = v;
        }
      }
      const send = async (): Promise<Answer> => {
        const response = await fetch(upstream + rec.path, { method: rec.method, headers, body: rec.body || undefined });
        return { status: response.status, headers: { "Content-Type": response.headers.get("Content-Type") ?? "" }, body: await response.text() };
      };
      const fault = proxy!.faults.get(rec.path.split("?")[0]!)?.shift();
      let answer: Answer | undefined;
      if (fault === "late") {
        setTimeout(() => void send().catch(() => undefined), FaultProxy.lateMs);
      } else {
        answer = await send();
      }
      if (fault === "drop") {
        return undefined;
      }
      if (fault === "503" || fault === "late") {
        return jsonAnswer(
          503,
          { error: { code: "limiter_unavailable", message: "redis did not answer in time", stream_id: rec.json?.stream_id } },
          { "Retry-After": "1" },
        );
      }
      return answer;
    });
    proxy = new FaultProxy(server);
    return proxy;
  }

  get url(): string {
    return this.server.url;
  }

  fail(path: string, ...faults: string[]): void {
    this.faults.set(path, [...(this.faults.get(path) ?? []), ...faults]);
  }

  received(path: string): Recorded[] {
    return this.server.received(path);
  }

  close(): Promise<void> {
    return this.server.close();
  }
}

/** Waits until check holds, for up to ms; whether it held. */
export async function eventually(check: () => boolean, ms = 2000): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) {
      return false;
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  return true;
}

/**
 * A fetch over node:https with TLS options (a CA, a client certificate):
 * what an application passes as ClientOptions.fetch for mutual TLS, since
 * the global fetch takes no certificate. Buffers each answer; enough for the
 * limiter's small JSON answers.
 */
export function httpsFetch(tls: { ca: Buffer; cert: Buffer; key: Buffer }): typeof fetch {
  return (async (input: string | URL | Request, init: RequestInit = {}) => {
    const url = new URL(String(input));
    const headers = new Headers(init.headers);
    return await new Promise<Response>((resolve, reject) => {
      const req = httpsRequest(url, { method: init.method ?? "GET", headers: Object.fromEntries(headers), ...tls }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", reject);
        res.on("end", () => {
          const answer = new Headers();
          for (const [k, v] of Object.entries(res.headers)) {
            if (typeof v === "string") {
              answer.set(k, v);
            }
          }
          resolve(new Response(Buffer.concat(chunks), { status: res.statusCode ?? 0, headers: answer }));
        });
      });
      req.on("error", reject);
      init.signal?.addEventListener("abort", () => req.destroy(init.signal?.reason as Error), { once: true });
      req.end(typeof init.body === "string" ? init.body : undefined);
    });
  }) as typeof fetch;
}
