// The redis-semaphore side of hack/bench.sh (BENCHMARKS.md): what
// BenchmarkAcquireRelease does with the limiter, done with redis-semaphore
// over ioredis (versions pinned in package.json beside this file). Each of
// WORKERS async workers, sharing one ioredis connection (the library's
// default use), loops: a Semaphore of limit 3 on a random user of 1,000,000
// (lockTimeout 10 s, as the test tier "three"; no auto-refresh and a single
// attempt, as Acquire neither heartbeats nor waits), tryAcquire(), then
// release() when it was acquired.
//
//   NODE_PATH=<dir>/node_modules node semaphore.js HOST:PORT [WORKERS] [WARMUP_MS] [DURATION_MS]
//
// After the warm-up it measures for the duration and prints one line of
// name=value fields: pairs/s, granted/pair and cpu-us/pair (this process's
// CPU time, user and system, per pair).
'use strict';

const crypto = require('node:crypto');
const Redis = require('ioredis');
const { Semaphore } = require('redis-semaphore');

const USERS = 1000000;
const LIMIT = 3;
const LOCK_TIMEOUT_MS = 10000;

async function main() {
  const [addr, workers = '50', warmupMs = '500', durationMs = '3000'] = process.argv.slice(2);
  if (!addr || !/^[^:]+:\d+$/.test(addr)) {
    throw new Error(`usage: semaphore.js HOST:PORT [WORKERS] [WARMUP_MS] [DURATION_MS], got ${process.argv.slice(2).join(' ')}`);
  }
  const [host, port] = addr.split(':');
  const redis = new Redis({ host, port: Number(port), maxRetriesPerRequest: 0, lazyConnect: true });
  await redis.connect();
  // Redis's own CPU over the window, read on a connection of its own so
  // that the workers' queue does not delay it.
  const info = new Redis({ host, port: Number(port), maxRetriesPerRequest: 0, lazyConnect: true });
  await info.connect();
  const redisCPU = async () => {
    const text = await info.info('cpu');
    const field = (name) => Number((text.match(new RegExp(`^${name}:([0-9.]+)`, 'm')) || [])[1]);
    return (field('used_cpu_user') + field('used_cpu_sys')) * 1e6;
  };
  const run = 'sem-' + crypto.randomBytes(6).toString('hex');

  const start = Date.now();
  const measureFrom = start + Number(warmupMs);
  const measureTo = measureFrom + Number(durationMs);
  let pairs = 0;
  let granted = 0;
  // CPU readings at the window's edges, by the first worker to cross each.
  let cpuFrom = null;
  let cpuTo = null;

  let redisFrom = null;
  let redisTo = null;
  const reads = [
    new Promise((resolve, reject) => setTimeout(() => redisCPU().then((v) => { redisFrom = v; resolve(); }, reject), measureFrom - Date.now())),
    new Promise((resolve, reject) => setTimeout(() => redisCPU().then((v) => { redisTo = v; resolve(); }, reject), measureTo - Date.now())),
  ];

  async function worker() {
    for (;;) {
      const began = Date.now();
      if (began >= measureFrom && cpuFrom === null) cpuFrom = process.cpuUsage();
      if (began >= measureTo) {
        if (cpuTo === null) cpuTo = process.cpuUsage();
        return;
      }
      const user = run + '-' + Math.floor(Math.random() * USERS);
      const sem = new Semaphore(redis, user, LIMIT, {
        lockTimeout: LOCK_TIMEOUT_MS,
        refreshInterval: 0,
        acquireAttemptsLimit: 1,
      });
      const ok = await sem.tryAcquire();
      if (ok) await sem.release();
      if (began >= measureFrom) {
        pairs++;
        if (ok) granted++;
      }
    }
  }
  await Promise.all([...Array.from({ length: Number(workers) }, worker), ...reads]);
  redis.disconnect();
  info.disconnect();
  if (pairs === 0 || cpuFrom === null || cpuTo === null) {
    throw new Error(`nothing measured: ${pairs} pairs in the window`);
  }
  const cpuUs = (cpuTo.user - cpuFrom.user) + (cpuTo.system - cpuFrom.system);
  const seconds = (measureTo - measureFrom) / 1000;
  const redisUs = redisTo - redisFrom;
  if (!(redisUs >= 0)) {
    throw new Error(`INFO cpu read ${redisFrom} then ${redisTo}`);
  }
  console.log(`pairs/s=${(pairs / seconds).toFixed(1)} granted/pair=${(granted / pairs).toFixed(4)} cpu-us/pair=${(cpuUs / pairs).toFixed(2)} redis-cpu-us/pair=${(redisUs / pairs).toFixed(2)} pairs=${pairs}`);
}

main().catch((err) => {
  console.error('semaphore:', err && err.message ? err.message : err);
  process.exit(1);
});
