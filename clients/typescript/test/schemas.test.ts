// The generated bodies (src/schemas.gen.ts): decode checks answers against
// the contract.

import assert from "node:assert/strict";
import { test } from "node:test";

import { DecodeError, ErrorCode, decode, parseTime } from "../src/schemas.gen.js";

const ANSWER = {
  granted: true,
  stream_id: "chat-1",
  used: 1,
  limit: 3,
  expires_at: "2030-01-02T03:04:05.678Z",
  ttl_ms: 120000,
  heartbeat_interval_ms: 20000,
  pruned: 0,
  degraded: false,
};

test("decode returns the schema's fields, dates parsed, unknown fields left out", () => {
  const got = decode("AcquireResponse", { ...ANSWER, added_later: { x: 1 } });
  assert.equal(got.stream_id, "chat-1");
  assert.deepEqual(got.expires_at, new Date(Date.UTC(2030, 0, 2, 3, 4, 5, 678)));
  assert.ok(!("added_later" in got));
});

test("decode refuses what breaks the contract, naming the field", () => {
  const { used: _, ...withoutUsed } = ANSWER;
  const cases: [string, unknown, string][] = [
    ["a required field missing", withoutUsed, "AcquireResponse.used: required, but missing or null"],
    ["a required field null", { ...ANSWER, ttl_ms: null }, "AcquireResponse.ttl_ms: required, but missing or null"],
    ["a string for an integer", { ...ANSWER, limit: "3" }, "AcquireResponse.limit: want an integer, got a string"],
    ["a fraction for an integer", { ...ANSWER, limit: 2.5 }, "AcquireResponse.limit: want an integer, got a number"],
    ["a time that is not RFC 3339", { ...ANSWER, expires_at: "tomorrow" }, 'AcquireResponse.expires_at: want an RFC 3339 date-time, got "tomorrow"'],
    ["not an object", [ANSWER], "AcquireResponse: want a JSON object, got an array"],
  ];
  for (const [name, data, message] of cases) {
    assert.throws(() => decode("AcquireResponse", data), { name: "DecodeError", message }, name);
  }
});

test("decode walks arrays of objects", () => {
  const got = decode("HeartbeatsResponse", {
    results: [{ stream_id: "a", alive: false, degraded: false, error: { code: "unknown_plan", message: "m" } }],
  });
  assert.equal(got.results[0]?.error?.code, ErrorCode.UnknownPlan);
  assert.throws(
    () => decode("HeartbeatsResponse", { results: [{ stream_id: "a", alive: true, degraded: false }, { stream_id: "b", degraded: false }] }),
    (err: unknown) => err instanceof DecodeError && err.message === "HeartbeatsResponse.results[1].alive: required, but missing or null",
  );
});

test("times", () => {
  assert.deepEqual(parseTime("2030-01-02T03:04:05Z"), new Date(Date.UTC(2030, 0, 2, 3, 4, 5)));
  assert.deepEqual(parseTime("2030-01-02T03:04:05.123456789Z"), new Date(Date.UTC(2030, 0, 2, 3, 4, 5, 123)));
  assert.deepEqual(parseTime("2030-01-02T05:04:05.5+02:00"), new Date(Date.UTC(2030, 0, 2, 3, 4, 5, 500)));
  for (const bad of ["2030-01-02", "2030-01-02 03:04:05Z", "2030-13-02T03:04:05Z", "2030-01-02T03:04:05"]) {
    assert.equal(parseTime(bad), undefined, bad);
  }
});
