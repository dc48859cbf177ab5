/**
 * Failure drill 6 (seed 000, issue 4): an empty result causes a bounded pause, not a fast
 * loop. Two real worker processes, each consuming two empty queues with three readers per
 * queue, talk to PostgreSQL through a proxy each; the proxy counts the claim statements on
 * the wire (by prepared-statement name, and per queue by the bound queue parameter), so the
 * count does not rely on the library's own accounting.
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../../helpers/databases.js';
import { PgProxy } from '../../helpers/pg-proxy.js';
import { enqueueKeys } from '../../helpers/drills.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';

const schema = uniqueSchema('idle');
const proxies: PgProxy[] = [];

beforeAll(async () => {
  const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  await store.migrate('auto');
  await store.close();
  await createEffectTables(PG_URL, schema);
});
afterEach(async () => {
  await killAllWorkers();
  await Promise.all(proxies.splice(0).map((proxy) => proxy.close()));
});
afterAll(() => dropPgSchema(schema));

it('drill 6 — idle workers claim at the rate maxPollMs implies: one claim loop per queue per process, whatever the reader count', async () => {
  const queues = ['idle-a', 'idle-b'];
  const minPollMs = 20;
  const maxPollMs = 250;
  const readers = 3;
  const reaperIntervalMs = 1_000;
  for (let i = 0; i < 2; i++) proxies.push(await PgProxy.start(PG_URL));
  const workers = await Promise.all(
    proxies.map((proxy) =>
      WorkerProcess.start({
        url: proxy.urlFor(PG_URL),
        schema,
        queue: queues[0]!,
        extraQueues: queues.slice(1),
        minReaders: readers,
        maxReaders: readers,
        minPollMs,
        maxPollMs,
        reaperIntervalMs,
      }),
    ),
  );

  // After empty claims the pause doubles from minPollMs and is capped at maxPollMs (jitter
  // only adds, never past the cap): 20, 40, 80, 160, then 250 ms — the ramp is over ~0.4 s
  // after boot. Skip a full second of it, then measure a steady window. The window has to be
  // waited out: it is a rate being measured, not a state being awaited.
  const from = Date.now() + 1_000;
  const windowMs = 4_000;
  const to = from + windowMs;
  await new Promise((resolve) => setTimeout(resolve, to - Date.now() + 50));

  // One claim loop per queue: after a claim, the next comes no sooner than maxPollMs later.
  const perLoop = Math.floor(windowMs / maxPollMs) + 1;
  const rates: string[] = [];
  for (const [i, proxy] of proxies.entries()) {
    expect(workers[i]!.alive).toBe(true);
    for (const queue of queues) {
      const claims = proxy.count('_claim', from, to, queue);
      rates.push(`process ${i + 1} '${queue}': ${claims} claims in ${windowMs} ms`);
      expect(claims, rates.at(-1)).toBeLessThanOrEqual(perLoop);
      // Not starved either: the loop keeps polling (a pause is bounded, not endless).
      expect(claims, rates.at(-1)).toBeGreaterThanOrEqual(Math.floor(perLoop / 2));
    }
    // Nothing else loops either: everything this process sent in the window is the claims,
    // the reaper (one statement per interval), at most one retention run, and little else.
    // (Readers equal maxReaders, so the activation check never needs the database.)
    const all = proxy.statements.filter((s) => s.at >= from && s.at < to).length;
    rates.push(`process ${i + 1}: ${all} statements of any kind in ${windowMs} ms`);
    const reaper = Math.floor(windowMs / reaperIntervalMs) + 1;
    expect(all, `process ${i + 1}: ${all} statements in ${windowMs} ms`).toBeLessThanOrEqual(
      queues.length * perLoop + reaper + 3,
    );
  }
  console.log(`idle polling, maxPollMs ${maxPollMs}, ${readers} readers per queue:\n  ${rates.join('\n  ')}`);
});

it('a paused queue with jobs waiting costs what an idle queue costs: the same claims per second, and nothing leased', async () => {
  const paused = 'paused-full';
  const idle = 'idle-beside';
  const maxPollMs = 250;
  const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  try {
    await store.pauseQueue(paused, 'drill');
    await enqueueKeys(
      store,
      paused,
      Array.from({ length: 50 }, (_, i) => `waiting-${i}`),
    );
    const proxy = await PgProxy.start(PG_URL);
    proxies.push(proxy);
    const worker = await WorkerProcess.start({
      url: proxy.urlFor(PG_URL),
      schema,
      queue: paused,
      extraQueues: [idle],
      // Room to start readers: the activation rule must not count a paused queue's jobs as work.
      minReaders: 1,
      maxReaders: 3,
      minPollMs: 20,
      maxPollMs,
      reaperIntervalMs: 1_000,
    });
    const from = Date.now() + 1_000;
    const windowMs = 3_000;
    const to = from + windowMs;
    await new Promise((resolve) => setTimeout(resolve, to - Date.now() + 50));
    expect(worker.alive).toBe(true);
    const pausedClaims = proxy.count('_claim', from, to, paused);
    const idleClaims = proxy.count('_claim', from, to, idle);
    const perLoop = Math.floor(windowMs / maxPollMs) + 1;
    expect(pausedClaims, `paused: ${pausedClaims}, idle: ${idleClaims}`).toBeLessThanOrEqual(perLoop);
    expect(Math.abs(pausedClaims - idleClaims), `paused: ${pausedClaims}, idle: ${idleClaims}`).toBeLessThanOrEqual(2);
    expect(idleClaims, 'the loops keep polling').toBeGreaterThanOrEqual(Math.floor(perLoop / 2));
    // Nothing else spins either: the two claim loops, the reaper, at most a retention run and little else.
    const all = proxy.statements.filter((statement) => statement.at >= from && statement.at < to).length;
    expect(all, `${all} statements in ${windowMs} ms`).toBeLessThanOrEqual(2 * perLoop + windowMs / 1_000 + 1 + 3);
    expect(worker.received('started')).toEqual([]);
    expect((await store.stats(paused)).ready).toBe(50);
  } finally {
    await store.close();
  }
});
