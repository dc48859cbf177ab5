/**
 * Flow control across processes (issue 24): real worker processes with the limits a user sets,
 * checked from the database clock. A handler runs from its `runs` row (clock_timestamp() at its
 * start) to its `effects` row (written as it ends); a job is leased from its claimed_at to its
 * finished_at. Both must respect the limits at every instant.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import type { QueueOptions } from '../../../lib/src/core/options.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../../helpers/databases.js';
import { waitFor } from '../../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';

const schema = uniqueSchema('flow');
let store: QueueStore;
const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 25 };

beforeAll(async () => {
  store = createPostgresStore({ url: PG_URL, poolSize: 4 }, { schema });
  await store.migrate('auto');
  await createEffectTables(PG_URL, schema);
});
afterEach(() => killAllWorkers());
afterAll(async () => {
  await store?.close();
  await dropPgSchema(schema);
});

const workers = (queue: string, count: number, queueOptions: QueueOptions, handlerDelayMs: number) =>
  Promise.all(
    Array.from({ length: count }, (_, n) =>
      WorkerProcess.start({
        url: PG_URL,
        schema,
        queue,
        workerId: `${queue}-w${n}`,
        minReaders: 1,
        maxReaders: 8,
        minPollMs: 20,
        maxPollMs: 200,
        handlerDelayMs,
        queueOptions,
      }),
    ),
  );

async function enqueue(queue: string, jobs: { key: string | null; count: number }[]): Promise<number> {
  let total = 0;
  for (const { key, count } of jobs) {
    const prepared = Array.from({ length: count }, (_, n) =>
      prepareJob(queue, { n }, key === null ? {} : { concurrencyKey: key }, LIMITS),
    );
    await store.enqueue(prepared);
    total += count;
  }
  return total;
}

interface Interval {
  key: string | null;
  from: number;
  to: number;
}

/** The most intervals open at one instant, over all of them and per key (an end before a start at the same time). */
function peaks(intervals: readonly Interval[]): { total: number; perKey: Map<string | null, number> } {
  const events = intervals
    .flatMap((i) => [
      { at: i.from, delta: 1, key: i.key },
      { at: i.to, delta: -1, key: i.key },
    ])
    .sort((a, b) => a.at - b.at || a.delta - b.delta);
  let open = 0;
  let total = 0;
  const openByKey = new Map<string | null, number>();
  const perKey = new Map<string | null, number>();
  for (const event of events) {
    open += event.delta;
    total = Math.max(total, open);
    const now = (openByKey.get(event.key) ?? 0) + event.delta;
    openByKey.set(event.key, now);
    perKey.set(event.key, Math.max(perKey.get(event.key) ?? 0, now));
  }
  return { total, perKey };
}

/** Handler runs (start to effect) and leases (claim to completion) of a queue's done jobs, in µs. */
async function intervalsOf(queue: string): Promise<{ handlers: Interval[]; leases: Interval[] }> {
  const rows = await sql<{ key: string | null; started: number; ended: number; claimed: number; finished: number }>(
    PG_URL,
    `SELECT j.concurrency_key AS key,
            (extract(epoch FROM r.at) * 1e6)::float8 AS started, (extract(epoch FROM e.at) * 1e6)::float8 AS ended,
            (extract(epoch FROM j.claimed_at) * 1e6)::float8 AS claimed,
            (extract(epoch FROM j.finished_at) * 1e6)::float8 AS finished
     FROM "${schema}".jobs j
     JOIN "${schema}".runs r ON r.job_id = j.id
     JOIN "${schema}".effects e ON e.job_id = j.id
     WHERE j.queue = $1 AND j.state = 'done'`,
    [queue],
  );
  return {
    handlers: rows.map((r) => ({ key: r.key, from: r.started, to: r.ended })),
    leases: rows.map((r) => ({ key: r.key, from: r.claimed, to: r.finished })),
  };
}

async function drain(queue: string, total: number, timeoutMs: number): Promise<void> {
  await waitFor(
    async () =>
      (
        await sql<{ n: number }>(
          PG_URL,
          `SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = $1 AND state = 'done'`,
          [queue],
        )
      )[0]!.n,
    (n) => n >= total,
    { what: `${total} jobs of ${queue} to be done`, timeoutMs },
  );
}

describe('flow control across 3 worker processes × 8 readers', () => {
  it('concurrencyPerKey 2 over 20 keys: never more than 2 of a key at once, and keys run in parallel', async () => {
    const queue = 'flow-per-key';
    const total = await enqueue(
      queue,
      Array.from({ length: 20 }, (_, n) => ({ key: `tenant-${n}`, count: 10 })),
    );
    await workers(queue, 3, { concurrencyPerKey: 2 }, 40);
    await drain(queue, total, 60_000);
    const { handlers, leases } = await intervalsOf(queue);
    expect(handlers).toHaveLength(total);
    for (const intervals of [handlers, leases]) {
      const { perKey, total: peak } = peaks(intervals);
      expect(Math.max(...perKey.values())).toBeLessThanOrEqual(2);
      expect(peak, 'different keys run at the same time').toBeGreaterThan(4);
    }
  }, 90_000);

  it('globalConcurrency 5: never more than 5 jobs of the queue at once across the processes', async () => {
    const queue = 'flow-global';
    const total = await enqueue(queue, [
      { key: null, count: 60 },
      { key: 'k1', count: 30 },
      { key: 'k2', count: 30 },
    ]);
    await workers(queue, 3, { globalConcurrency: 5 }, 40);
    await drain(queue, total, 60_000);
    const { handlers, leases } = await intervalsOf(queue);
    expect(peaks(leases).total).toBeLessThanOrEqual(5);
    expect(peaks(handlers).total).toBeLessThanOrEqual(5);
    expect(peaks(handlers).total, 'the limit is used, not just respected').toBe(5);
  }, 90_000);

  it('rateLimit 50 per second for 10 s: every 1 s window holds at most 50 starts, and the total is within 10% of 500', async () => {
    const queue = 'flow-rate';
    await enqueue(queue, [{ key: null, count: 1_500 }]);
    const started = await workers(queue, 3, { rateLimit: { max: 50, perMs: 1_000 } }, 5);
    const [first] = await waitFor(
      () =>
        sql<{ at: number | null }>(
          PG_URL,
          `SELECT (extract(epoch FROM min(claimed_at)) * 1e6)::float8 AS at FROM "${schema}".jobs WHERE queue = $1`,
          [queue],
        ),
      (rows) => rows[0]!.at !== null,
      { what: 'the first start', timeoutMs: 30_000 },
    );
    await new Promise((resolve) => setTimeout(resolve, 10_500));
    await Promise.all(started.map((worker) => worker.stop()));
    const starts = (
      await sql<{ at: number }>(
        PG_URL,
        `SELECT (extract(epoch FROM claimed_at) * 1e6)::float8 AS at FROM "${schema}".jobs
         WHERE queue = $1 AND claimed_at IS NOT NULL ORDER BY claimed_at`,
        [queue],
      )
    ).map((row) => row.at);
    // Every window of 1 s that starts at a start holds the most a window can.
    let worst = 0;
    for (let i = 0, j = 0; i < starts.length; i++) {
      while (j < starts.length && starts[j]! < starts[i]! + 1_000_000) j++;
      worst = Math.max(worst, j - i);
    }
    expect(worst).toBeLessThanOrEqual(50);
    const inTenSeconds = starts.filter((at) => at < first!.at! + 10_000_000).length;
    expect(inTenSeconds).toBeGreaterThanOrEqual(450);
    expect(inTenSeconds).toBeLessThanOrEqual(500);
  }, 90_000);

  it('every key at its limit: the readers back off as on an empty queue (claims per second bounded by the poll backoff)', async () => {
    const queue = 'flow-saturated';
    await enqueue(
      queue,
      ['a', 'b', 'c'].map((key) => ({ key, count: 5 })),
    );
    // The README's defaults for polling (minPollMs 50, maxPollMs 2 s); handlers that never end.
    const worker = await WorkerProcess.start({
      url: PG_URL,
      schema,
      queue,
      workerId: 'flow-saturated',
      mode: 'hang',
      maxReaders: 8,
      events: true,
      queueOptions: { concurrencyPerKey: 1 },
    });
    for (let n = 0; n < 3; n++) await worker.next((m) => m.type === 'started');
    const before = worker.received('event', 'emptyClaim').length + worker.received('event', 'claimed').length;
    await new Promise((resolve) => setTimeout(resolve, 6_000));
    const claims = worker.received('event', 'emptyClaim').length + worker.received('event', 'claimed').length - before;
    // 50 ms doubling to 2 s: at most 6 claims to reach the cap, then one every 2 s (jittered).
    expect(claims).toBeLessThanOrEqual(12);
    expect((await store.stats(queue)).leased).toBe(3);
  }, 60_000);

  it('a crash while holding slots (SIGKILL): the slots come back with the lease, not later', async () => {
    const queue = 'flow-crash';
    await enqueue(queue, [{ key: 'k', count: 4 }]);
    const victim = await WorkerProcess.start({
      url: PG_URL,
      schema,
      queue,
      workerId: 'flow-crash-victim',
      mode: 'hang',
      leaseMs: 1_500,
      minPollMs: 20,
      maxPollMs: 200,
      queueOptions: { concurrencyPerKey: 2 },
    });
    await victim.next((m) => m.type === 'started');
    await victim.next((m) => m.type === 'started');
    victim.kill();
    await victim.exited;
    const [killedAt] = await sql<{ at: Date }>(PG_URL, 'SELECT clock_timestamp() AS at');
    const [rescuer] = await workers(queue, 1, { concurrencyPerKey: 2 }, 10);
    await drain(queue, 4, 30_000);
    const rows = await sql<{ reclaimed: Date }>(
      PG_URL,
      `SELECT min(j.claimed_at) AS reclaimed
       FROM "${schema}".attempts a JOIN "${schema}".jobs j ON j.id = a.job_id
       WHERE a.queue = $1 AND a.outcome = 'lease-expired'`,
      [queue],
    );
    // Two attempts were lost with the process; the jobs ran again within a few reaper ticks of
    // their leases' end (the reaper runs every 500 ms here), not after some later timeout.
    const reclaimDelay = rows[0]!.reclaimed.getTime() - killedAt!.at.getTime();
    expect(reclaimDelay).toBeLessThan(1_500 + 3_000);
    expect(rescuer).toBeDefined();
  }, 60_000);
});
