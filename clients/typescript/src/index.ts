/**
 * TypeScript client of the limiter: per-user caps on concurrent streams
 * (Node.js 18.17+, the global fetch, no runtime dependencies).
 *
 * ```ts
 * import { Client, isLimited } from "@joishi/limiter-client";
 *
 * const limits = new Client("http://limiter:8080");
 * try {
 *   await limits.withLease("user-42", "paid", async (lease) => {
 *     await streamTo(res, { signal: lease.signal }); // aborts if the slot is lost
 *   }, { label: "pod-7" });
 * } catch (err) {
 *   if (isLimited(err)) refuse(err.used, err.limit, err.retryAfterMs);
 *   else throw err;
 * }
 * await limits.close();
 * ```
 *
 * The request and response bodies (schemas.gen.ts) are generated from the
 * service's api/openapi.yaml.
 */
export { Admin, type AdminOptions } from "./admin.js";
export { Client, MAX_LABEL_BYTES, type AcquireOptions, type ClientOptions } from "./client.js";
export { ClientCode, LimiterError, isLimited, isNotSlotHolder, isPoolLimited, type LimiterErrorFields } from "./errors.js";
export type { Logger } from "./heartbeat.js";
export { Lease } from "./lease.js";
export * as schemas from "./schemas.gen.js";
export { ErrorCode, Paths } from "./schemas.gen.js";
