import { ClientCode, LimiterError, fromAnswer } from "./errors.js";
import { DecodeError, ErrorCode, decode, type Schemas } from "./schemas.gen.js";

export const USER_AGENT = "joishi-limiter-typescript-client";

/** Bounds what is read of a slot API answer: a full batch answer is about 100 KiB. */
export const MAX_ANSWER_BYTES = 4 << 20;
/** An admin list of a user's slots may exceed 10 MiB. */
export const MAX_ADMIN_ANSWER_BYTES = 16 << 20;

/** The environment variable a Client reads its caller token from by default. */
export const ENV_TOKEN = "LIMITER_TOKEN";

/** Checks a base URL and returns it without a trailing slash. */
export function parseBaseURL(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new TypeError(`base URL must be http(s)://host[:port][/prefix], got ${JSON.stringify(raw)}`);
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.host === "") {
    throw new TypeError(`base URL must be http(s)://host[:port][/prefix], got ${JSON.stringify(raw)}`);
  }
  if (url.search !== "" || url.hash !== "") {
    throw new TypeError(`base URL must have no query or fragment, got ${JSON.stringify(raw)}`);
  }
  return raw.replace(/\/+$/, "");
}

export interface CallOptions {
  /** Ends the call early; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Overrides the endpoint's timeout for this call. */
  timeoutMs?: number;
}

/** One listener of the limiter and how to call it: JSON in, a checked answer out. */
export class Endpoint {
  readonly base: string;

  constructor(
    base: string,
    private readonly token: string,
    private readonly fetcher: typeof fetch,
    readonly timeoutMs: number,
    private readonly maxAnswerBytes = MAX_ANSWER_BYTES,
  ) {
    this.base = parseBaseURL(base);
    if (!(timeoutMs > 0)) {
      throw new RangeError(`requestTimeoutMs must be > 0, got ${timeoutMs}`);
    }
  }

  /**
   * Sends body as JSON (none when undefined) and returns the 2xx answer
   * checked against the schema answer. A non-2xx answer rejects with its
   * LimiterError, a 3xx too (`http_<status>`, naming its Location: no
   * redirect is followed); no answer within the timeout (refused, dropped,
   * slow) with `limiter_unavailable`, status 0; an answer that does not match the
   * contract with `invalid_answer`. The end of options.signal rejects with
   * its reason: the caller gave up, which says nothing about the limiter.
   */
  async call<K extends keyof Schemas>(
    method: string,
    path: string,
    body: object | undefined,
    answer: K,
    options: CallOptions = {},
  ): Promise<Schemas[K]> {
    const what = `${method} ${path}`;
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new Error(`no answer within ${timeoutMs}ms`)), timeoutMs);
    const onAbort = () => controller.abort(options.signal?.reason);
    options.signal?.addEventListener("abort", onAbort, { once: true });
    if (options.signal?.aborted) {
      onAbort();
    }
    const headers: Record<string, string> = { Accept: "application/json", "User-Agent": USER_AGENT };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
    }
    if (this.token) {
      headers.Authorization = `Bearer ${this.token}`;
    }
    let status: number;
    let text: string;
    let retryAfter: string | null;
    try {
      const response = await this.fetcher(this.base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: controller.signal,
        // The limiter never redirects its routes, so a 3xx comes from
        // something in between: following it would send the bearer token
        // to the same origin's other paths or its https, and a POST again
        // as a GET.
        redirect: "manual",
      });
      status = response.status;
      if (status >= 300 && status <= 399) {
        await response.body?.cancel();
        const to = response.headers.get("Location") ?? "nowhere (no Location)";
        throw new LimiterError(`http_${status}`, `${what}: redirected to ${to}: the client follows no redirect`, { status });
      }
      retryAfter = response.headers.get("Retry-After");
      text = await this.read(response, what);
    } catch (err) {
      if (err instanceof LimiterError) {
        throw err;
      }
      if (options.signal?.aborted) {
        throw options.signal.reason;
      }
      const reason = controller.signal.aborted ? (controller.signal.reason as Error).message : describeCause(err);
      throw new LimiterError(ErrorCode.LimiterUnavailable, `${what}: no answer: ${reason}`, { cause: err });
    } finally {
      clearTimeout(timer);
      options.signal?.removeEventListener("abort", onAbort);
    }
    if (status < 200 || status > 299) {
      throw fromAnswer(status, text, retryAfter);
    }
    try {
      return decode(answer, JSON.parse(text));
    } catch (err) {
      if (err instanceof SyntaxError || err instanceof DecodeError) {
        throw new LimiterError(ClientCode.InvalidAnswer, `${what}: answer (HTTP ${status}) does not match the contract: ${err.message}`, {
          status,
          cause: err,
        });
      }
      throw err;
    }
  }

  /** Reads an answer's body, at most maxAnswerBytes of it. */
  private async read(response: Response, what: string): Promise<string> {
    const chunks: Uint8Array[] = [];
    let size = 0;
    if (response.body) {
      for await (const chunk of response.body) {
        size += chunk.byteLength;
        if (size > this.maxAnswerBytes) {
          await response.body.cancel();
          throw new LimiterError(ClientCode.InvalidAnswer, `${what}: answer exceeds ${this.maxAnswerBytes} bytes`, {
            status: response.status,
          });
        }
        chunks.push(chunk);
      }
    }
    return Buffer.concat(chunks).toString("utf8");
  }
}

/** The innermost message of a fetch failure ("fetch failed" says little). */
function describeCause(err: unknown): string {
  let e: unknown = err;
  while (e instanceof Error && e.cause instanceof Error) {
    e = e.cause;
  }
  if (e instanceof Error) {
    const code = (e as { code?: unknown }).code;
    return typeof code === "string" && !e.message.includes(code) ? `${e.message} (${code})` : e.message;
  }
  return String(e);
}
