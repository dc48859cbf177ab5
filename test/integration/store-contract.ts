import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { SqlQueueConfigError, SqlQueueSchemaError, SqlQueueValidationError } from '../../lib/src/core/errors.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type {
  ScheduleFiring,
  ScheduleRow,
  ScheduleStore,
  ScheduleUpsert,
} from '../../lib/src/core/schedules/schedule.types.js';
import {
  GROUP_SCAN_LIMIT,
  JOB_PREVIEW_CHARS,
  type ClaimedJob,
  type EnqueueOptions,
  type JobListPage,
  type ListedJobState,
  type JobSummary,
  type NewJob,
  type ThroughputCount,
} from '../../lib/src/core/types.js';
import { withTimeout } from '../../lib/src/core/timeout.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { uniqueSchema } from '../helpers/databases.js';
import { fireNextHour, keyedAsTick, later, tickJob } from '../helpers/schedules.js';
import { waitFor } from '../helpers/wait-for.js';
import { scheduleJobKey } from '../../lib/src/core/schedules/schedule-options.js';

/** A transaction opened the way an application would, to pass to enqueue. */
export interface CallerTransaction {
  handle: unknown;
  commit(): Promise<void>;
  rollback(): Promise<void>;
}

/** One database the contract runs against. */
export interface StoreTarget {
  name: string;
  /** A store with its own connections in `schema` (not migrated). */
  openStore(schema: string, options?: { poolSize?: number }): Promise<QueueStore>;
  beginTransaction(): Promise<CallerTransaction>;
  dropSchema(schema: string): Promise<void>;
  /** Records a newer schema version, as a future release of the library would. */
  bumpSchemaVersion(schema: string, version: number): Promise<void>;
  /** False for a single-session embedded database: readers wait for an open transaction. */
  concurrentSessions: boolean;
  /** Scale for the heavy cases, so slow targets stay within the test budget. */
  scale: number;
}

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 3 };
const WORKER = 'contract-worker';

function job(queue: string, payload: unknown, options?: EnqueueOptions): NewJob {
  return prepareJob(queue, payload, options, LIMITS);
}

/** The failure report for a claimed job: retried at once, no stack, unless the options say otherwise. */
function failure(
  claimed: { id: string; claimToken: string },
  error: string,
  options: { dead?: boolean; retryDelayMs?: number; stack?: string | null } = {},
) {
  return {
    id: claimed.id,
    claimToken: claimed.claimToken,
    error,
    stack: options.stack ?? null,
    retryDelayMs: options.retryDelayMs ?? 0,
    dead: options.dead ?? false,
    workerId: WORKER,
  };
}

/** Job ids in numeric order (they are bigint text). */
function byId(a: string, b: string): number {
  return Number(BigInt(a) - BigInt(b));
}

/** The counts of some throughput buckets added up. */
function sum(buckets: readonly ThroughputCount[]): Omit<ThroughputCount, 'queue'> {
  return buckets.reduce(
    (total, b) => ({
      completed: total.completed + b.completed,
      failed: total.failed + b.failed,
      dead: total.dead + b.dead,
    }),
    { completed: 0, failed: 0, dead: 0 },
  );
}

export function describeStoreContract(target: StoreTarget): void {
  describe(`QueueStore contract: ${target.name}`, () => {
    const schema = uniqueSchema(target.name.replace(/\W/g, '').toLowerCase());
    let store: QueueStore;
    const opened: QueueStore[] = [];
    let queueSeq = 0;
    const newQueue = (label: string) => `${label}.${++queueSeq}`;

    async function openExtra(count: number): Promise<QueueStore[]> {
      const stores = await Promise.all(Array.from({ length: count }, () => target.openStore(schema, { poolSize: 1 })));
      opened.push(...stores);
      return stores;
    }

    async function claimOne(queue: string, leaseMs = 30_000, on: QueueStore = store): Promise<ClaimedJob> {
      const [claimed] = await on.claim({ queue, limit: 1, leaseMs, workerId: WORKER });
      expect(claimed, `a job should be claimable in ${queue}`).toBeDefined();
      return claimed!;
    }

    /** Leases expire on the database clock; poll the reaper instead of sleeping a guess. */
    async function reapUntil(queue: string, jobId: string): Promise<void> {
      await waitFor(
        async () => {
          await store.reap(100);
          return (await store.getJob(jobId))?.state;
        },
        (state) => state === 'ready' || state === 'dead',
        { what: `job ${jobId} in ${queue} to be reaped` },
      );
    }

    beforeAll(async () => {
      store = await target.openStore(schema, { poolSize: 4 });
      await store.migrate('auto');
    });

    afterAll(async () => {
      await Promise.all(opened.map((s) => s.close()));
      await store?.close();
      await target.dropSchema(schema);
    });

    describe('schema and migrations', () => {
      it('migrates once when ten instances boot at the same time', async () => {
        const fresh = uniqueSchema('mig');
        const stores = await Promise.all(Array.from({ length: 10 }, () => target.openStore(fresh, { poolSize: 1 })));
        try {
          const statuses = await Promise.all(stores.map((s) => s.migrate('auto')));
          expect(statuses.every((s) => s.current === s.latest)).toBe(true);
          await expect(stores[0]!.migrate('check')).resolves.toMatchObject({ current: statuses[0]!.latest });
          // The schema works after the concurrent install.
          const [result] = await stores[0]!.enqueue([job('mig.q', { ok: true })]);
          expect(result!.created).toBe(true);
        } finally {
          await Promise.all(stores.map((s) => s.close()));
          await target.dropSchema(fresh);
        }
      });

      it("'check' refuses a schema that is not installed, naming the fix", async () => {
        const fresh = uniqueSchema('chk');
        const other = await target.openStore(fresh, { poolSize: 1 });
        try {
          await expect(other.migrate('check')).rejects.toThrow(SqlQueueSchemaError);
          await expect(other.migrate('check')).rejects.toThrow(/version 0.*migrations: 'auto'/);
        } finally {
          await other.close();
          await target.dropSchema(fresh);
        }
      });

      it('refuses a database whose schema is newer than the code', async () => {
        const fresh = uniqueSchema('new');
        const other = await target.openStore(fresh, { poolSize: 1 });
        try {
          const status = await other.migrate('auto');
          await target.bumpSchemaVersion(fresh, status.latest + 1);
          await expect(other.migrate('auto')).rejects.toThrow(/newer than this nestjs-sql-queue/);
          await expect(other.migrate('check')).rejects.toThrow(SqlQueueSchemaError);
        } finally {
          await other.close();
          await target.dropSchema(fresh);
        }
      });

      it('rejects schema names that could inject SQL before any SQL runs', async () => {
        for (const bad of ['x"; DROP TABLE jobs; --', 'a b', "o'hara", '1abc', 'x]; DROP', '']) {
          await expect(target.openStore(bad)).rejects.toThrow(SqlQueueConfigError);
        }
      });

      it('rejects queue names that could inject SQL before any SQL runs', () => {
        for (const bad of ["q'; DELETE FROM jobs; --", 'a b', '', 'x'.repeat(129), 'q]']) {
          expect(() => job(bad, {})).toThrow(SqlQueueValidationError);
        }
      });
    });

    describe('enqueue', () => {
      it('enqueues one job and reads it back with database timestamps', async () => {
        const queue = newQueue('one');
        const [result] = await store.enqueue([job(queue, { to: 'a@example.com', n: 1 }, { priority: 3 })]);
        expect(result).toMatchObject({ created: true });
        expect(result!.jobId).toMatch(/^\d+$/);
        const record = await store.getJob(result!.jobId);
        expect(record).toMatchObject({
          queue,
          state: 'ready',
          payload: { to: 'a@example.com', n: 1 },
          priority: 3,
          attempts: 0,
          maxAttempts: 3,
          claimToken: null,
          leaseUntil: null,
        });
        expect(record!.createdAt).toBeInstanceOf(Date);
        expect(record!.runAt.getTime()).toBeGreaterThanOrEqual(record!.createdAt.getTime() - 1);
      });

      it(`bulk-enqueues ${10_000} jobs in one call, results in input order`, async () => {
        const queue = newQueue('bulk');
        const jobs = Array.from({ length: 10_000 }, (_, i) => job(queue, { i }));
        const results = await store.enqueue(jobs);
        expect(results).toHaveLength(10_000);
        expect(results.every((r) => r.created)).toBe(true);
        // Ids rise in input order (FIFO among equal priorities), each mapped to its own input.
        const ids = results.map((r) => BigInt(r.jobId));
        expect(ids.every((id, i) => i === 0 || id > ids[i - 1]!)).toBe(true);
        for (const i of [0, 1234, 9_999]) {
          expect((await store.getJob(results[i]!.jobId))!.payload).toEqual({ i });
        }
        const stats = await store.stats(queue);
        expect(stats.ready).toBe(10_000);
      });

      it('returns the existing job for a repeated idempotency key, within and across calls', async () => {
        const queue = newQueue('idem');
        const [first] = await store.enqueue([job(queue, { v: 1 }, { idempotencyKey: 'order-1' })]);
        const [again] = await store.enqueue([job(queue, { v: 2 }, { idempotencyKey: 'order-1' })]);
        expect(first!.created).toBe(true);
        expect(again).toEqual({ jobId: first!.jobId, created: false });
        const bulk = await store.enqueue([
          job(queue, { v: 3 }, { idempotencyKey: 'order-1' }),
          job(queue, { v: 4 }, { idempotencyKey: 'order-2' }),
          job(queue, { v: 5 }, { idempotencyKey: 'order-2' }),
          job(queue, { v: 6 }),
        ]);
        expect(bulk[0]).toEqual({ jobId: first!.jobId, created: false });
        expect(bulk[1]!.created).toBe(true);
        expect(bulk[2]).toEqual({ jobId: bulk[1]!.jobId, created: false });
        expect(bulk[3]!.created).toBe(true);
        expect((await store.getJob(first!.jobId))!.payload).toEqual({ v: 1 });
        // Keys compare exactly, in every dialect: case matters.
        const [upper] = await store.enqueue([job(queue, {}, { idempotencyKey: 'ORDER-1' })]);
        expect(upper!.created).toBe(true);
        // The same key in another queue is another job.
        const [other] = await store.enqueue([job(newQueue('idem-other'), {}, { idempotencyKey: 'order-1' })]);
        expect(other!.created).toBe(true);
      });

      it('creates one job when 16 producers on separate connections race with one key', async () => {
        const queue = newQueue('race');
        const producers = await openExtra(16);
        const results = await Promise.all(
          producers.map((p, i) => p.enqueue([job(queue, { producer: i }, { idempotencyKey: 'same-business-id' })])),
        );
        const flat = results.map((r) => r[0]!);
        expect(flat.filter((r) => r.created)).toHaveLength(1);
        expect(new Set(flat.map((r) => r.jobId)).size).toBe(1);
        expect((await store.stats(queue)).ready).toBe(1);
      });

      it('commits and rolls back with the caller transaction', async () => {
        const queue = newQueue('tx');
        const committed = await target.beginTransaction();
        const [kept] = await store.enqueue([job(queue, { keep: true })], committed.handle);
        if (target.concurrentSessions) {
          // Not claimable before the caller commits. Probed through the READPAST / SKIP LOCKED
          // paths only: on SQL Server with READ_COMMITTED_SNAPSHOT off a plain read (getJob)
          // would wait on the caller's uncommitted insert instead of answering.
          expect(await store.claim({ queue, limit: 10, leaseMs: 60_000, workerId: 'tx-probe' })).toEqual([]);
          expect(await store.hasClaimableWork(queue)).toBe(false);
        }
        await committed.commit();
        expect((await store.getJob(kept!.jobId))!.state).toBe('ready');

        const rolledBack = await target.beginTransaction();
        const [dropped] = await store.enqueue(
          [job(queue, { keep: false }), job(queue, { keep: false, n: 2 })].slice(0, 1),
          rolledBack.handle,
        );
        const bulkDropped = await store.enqueue([job(queue, { bulk: 1 }), job(queue, { bulk: 2 })], rolledBack.handle);
        await rolledBack.rollback();
        expect(await store.getJob(dropped!.jobId)).toBeNull();
        expect(await store.getJob(bulkDropped[0]!.jobId)).toBeNull();
        expect((await store.stats(queue)).ready).toBe(1);
      });

      it('stores each job’s trace context and hands it to the claim: one job, many (mixed and uniform), grouped, in a caller transaction', async () => {
        const ctx = (n: number) =>
          JSON.stringify({ traceparent: `00-${String(n).padStart(32, '0')}-${'1'.repeat(16)}-01` });
        const traced = (queue: string, payload: unknown, traceContext: string | null, options?: EnqueueOptions) => ({
          ...job(queue, payload, options),
          traceContext,
        });
        const claimedContexts = async (queue: string, limit: number, groupBatchSize = 1) => {
          const claimed = await store.claim({ queue, limit, groupBatchSize, leaseMs: 60_000, workerId: WORKER });
          return new Map(claimed.map((c) => [c.id, c.traceContext ?? null]));
        };

        const single = newQueue('trace1');
        const [one] = await store.enqueue([traced(single, { n: 1 }, ctx(1))]);
        expect(await claimedContexts(single, 1)).toEqual(new Map([[one!.jobId, ctx(1)]]));

        // Different contexts and a null in one call (the general bulk path).
        const mixed = newQueue('trace-mixed');
        const mixedIds = await store.enqueue([
          traced(mixed, { n: 1 }, ctx(2)),
          traced(mixed, { n: 2 }, null),
          traced(mixed, { n: 3 }, ctx(3), { idempotencyKey: 'k' }),
        ]);
        expect(await claimedContexts(mixed, 10)).toEqual(
          new Map([
            [mixedIds[0]!.jobId, ctx(2)],
            [mixedIds[1]!.jobId, null],
            [mixedIds[2]!.jobId, ctx(3)],
          ]),
        );

        // One shared context and one shape (a uniform bulk, as enqueueMany sends).
        const uniform = newQueue('trace-uniform');
        const uniformIds = await store.enqueue(Array.from({ length: 5 }, (_, i) => traced(uniform, { i }, ctx(4))));
        const uniformClaimed = await claimedContexts(uniform, 10);
        expect([...uniformClaimed.keys()].sort(byId)).toEqual(uniformIds.map((r) => r.jobId).sort(byId));
        expect([...uniformClaimed.values()]).toEqual(Array(5).fill(ctx(4)));

        // A group batch: the followers carry their own contexts.
        const grouped = newQueue('trace-group');
        const groupIds = await store.enqueue(
          [1, 2, 3].map((n) => traced(grouped, { n }, ctx(10 + n), { groupKey: 'g' })),
        );
        expect(await claimedContexts(grouped, 1, 3)).toEqual(new Map(groupIds.map((r, i) => [r.jobId, ctx(11 + i)])));

        const inTx = newQueue('trace-tx');
        const tx = await target.beginTransaction();
        const [txJob] = await store.enqueue([traced(inTx, { n: 1 }, ctx(20))], tx.handle);
        await tx.commit();
        expect(await claimedContexts(inTx, 1)).toEqual(new Map([[txJob!.jobId, ctx(20)]]));
      });

      it('bulk enqueues sharing keys in crossing orders all succeed, one job per key (issue 10, C1)', async () => {
        const producers = await openExtra(2);
        for (let round = 0; round < 3; round++) {
          const queue = newQueue('crossing');
          const keys = Array.from({ length: Math.round(500 * target.scale) }, (_, i) => `order-${i}`);
          const batch = (order: string[]) => order.map((key) => job(queue, { key }, { idempotencyKey: key }));
          const reversed = [...keys].reverse();
          const [ra, rb] = await Promise.all([
            producers[0]!.enqueue(batch(keys)),
            producers[1]!.enqueue(batch(reversed)),
          ]);
          const byKeyA = new Map(keys.map((k, i) => [k, ra[i]!]));
          const byKeyB = new Map(reversed.map((k, i) => [k, rb[i]!]));
          for (const key of keys) {
            expect(byKeyA.get(key)!.jobId).toBe(byKeyB.get(key)!.jobId);
            expect(Number(byKeyA.get(key)!.created) + Number(byKeyB.get(key)!.created)).toBe(1);
          }
          expect((await store.stats(queue)).ready).toBe(keys.length);
        }
      });

      if (target.concurrentSessions) {
        it("a keyed enqueue does not wait for another key held in a caller's open transaction (issue 10, C2)", async () => {
          const queue = newQueue('keygap');
          const open = await target.beginTransaction();
          try {
            const [held] = await store.enqueue([job(queue, {}, { idempotencyKey: 'order-1001' })], open.handle);
            expect(held!.created).toBe(true);
            // Rising business keys: the next key sorts right after the held one. It must not queue
            // behind the open transaction (a range lock on the gap after order-1001 would).
            const [next] = await withTimeout(
              store.enqueue([job(queue, {}, { idempotencyKey: 'order-1002' })]),
              10_000,
              'a keyed enqueue next to a key in an open transaction',
            );
            expect(next!.created).toBe(true);
          } finally {
            await open.commit();
          }
          expect((await store.stats(queue)).ready).toBe(2);
        });

        it('caller transactions enqueueing the same keys in crossing orders wait for each other, never deadlock', async () => {
          const queue = newQueue('txcrossing');
          const keys = ['key-a', 'key-b', 'key-c'];
          const batch = (order: string[]) => order.map((key) => job(queue, { key }, { idempotencyKey: key }));
          const first = await target.beginTransaction();
          const second = await target.beginTransaction();
          let firstEnded = false;
          try {
            const created = await store.enqueue(batch(keys), first.handle);
            expect(created.every((r) => r.created)).toBe(true);
            // Waits on the first transaction's keys until it commits, then finds its jobs.
            const waiting = store.enqueue(batch([...keys].reverse()), second.handle);
            firstEnded = true;
            await first.commit();
            const found = await waiting;
            expect(found.map((r) => r.created)).toEqual([false, false, false]);
            expect(found.map((r) => r.jobId)).toEqual(created.map((r) => r.jobId).reverse());
          } finally {
            if (!firstEnded) await first.rollback();
            await second.commit();
          }
          expect((await store.stats(queue)).ready).toBe(3);
        });
      }

      it('refuses a transaction handle that is not a transaction', async () => {
        await expect(store.enqueue([job(newQueue('badtx'), {})], { not: 'a transaction' })).rejects.toThrow(
          SqlQueueValidationError,
        );
      });
    });

    describe("recorded queue settings: a job's maxAttempts", () => {
      async function maxAttemptsOf(results: readonly { jobId: string }[]): Promise<number[]> {
        return Promise.all(results.map(async (r) => (await store.getJob(r.jobId))!.maxAttempts));
      }

      it("is the job's own, else the queue's recorded setting, else the producer's default, in every enqueue statement", async () => {
        const queue = newQueue('settings');
        const other = newQueue('settings-other');
        // Nothing recorded: the producer's default (3 here).
        expect(await maxAttemptsOf(await store.enqueue([job(queue, {})]))).toEqual([3]);

        await store.recordQueueSettings([{ queue, maxAttempts: 7 }]);
        const single = await store.enqueue([job(queue, {})]);
        const singleOwn = await store.enqueue([job(queue, {}, { maxAttempts: 2 })]);
        const singleKeyed = await store.enqueue([job(queue, {}, { idempotencyKey: 'settings-1' })]);
        const uniform = await store.enqueue([job(queue, { n: 1 }), job(queue, { n: 2 })]);
        const uniformOwn = await store.enqueue([
          job(queue, {}, { maxAttempts: 5 }),
          job(queue, {}, { maxAttempts: 5 }),
        ]);
        const mixed = await store.enqueue([
          job(queue, {}, { idempotencyKey: 'settings-2' }),
          job(queue, {}, { maxAttempts: 4 }),
          job(queue, {}),
        ]);
        expect(await maxAttemptsOf([...single, ...singleOwn, ...singleKeyed])).toEqual([7, 2, 7]);
        expect(await maxAttemptsOf([...uniform, ...uniformOwn, ...mixed])).toEqual([7, 7, 5, 5, 7, 4, 7]);
        // Another queue is not affected.
        expect(await maxAttemptsOf(await store.enqueue([job(other, {})]))).toEqual([3]);

        // Recording again replaces the value; several queues at once.
        await store.recordQueueSettings([
          { queue, maxAttempts: 9 },
          { queue: other, maxAttempts: 4 },
        ]);
        expect(await maxAttemptsOf(await store.enqueue([job(queue, {})]))).toEqual([9]);
        expect(await maxAttemptsOf(await store.enqueue([job(other, {}), job(other, {})]))).toEqual([4, 4]);

        // Inside a caller's transaction too.
        const tx = await target.beginTransaction();
        const inTx = [
          ...(await store.enqueue([job(queue, {})], tx.handle)),
          ...(await store.enqueue([job(queue, {}), job(queue, {}, { maxAttempts: 1 })], tx.handle)),
        ];
        await tx.commit();
        expect(await maxAttemptsOf(inTx)).toEqual([9, 9, 1]);
      });

      it('is recorded safely by many processes at once, in any order', async () => {
        const first = newQueue('settings-race-a');
        const second = newQueue('settings-race-b');
        const recorders = await openExtra(8);
        await Promise.all(
          recorders.map((recorder, i) => {
            const settings = [
              { queue: first, maxAttempts: 10 + i },
              { queue: second, maxAttempts: 20 + i },
            ];
            return recorder.recordQueueSettings(i % 2 === 0 ? settings : settings.reverse());
          }),
        );
        const [a, b] = await maxAttemptsOf([
          ...(await store.enqueue([job(first, {})])),
          ...(await store.enqueue([job(second, {})])),
        ]);
        expect(a).toBeGreaterThanOrEqual(10);
        expect(a).toBeLessThanOrEqual(17);
        expect(b).toBeGreaterThanOrEqual(20);
        expect(b).toBeLessThanOrEqual(27);
      });

      it('refuses an invalid setting before any SQL runs', async () => {
        await expect(store.recordQueueSettings([{ queue: "x'--", maxAttempts: 3 }])).rejects.toThrow(
          SqlQueueValidationError,
        );
        await expect(store.recordQueueSettings([{ queue: newQueue('settings-bad'), maxAttempts: 0 }])).rejects.toThrow(
          /maxAttempts must be an integer from 1/,
        );
      });
    });

    describe('claim', () => {
      it(`${8} claimers on separate connections claim each of ${5000} jobs exactly once`, async () => {
        const queue = newQueue('drain');
        const total = Math.round(5000 * target.scale);
        await store.enqueue(Array.from({ length: total }, (_, i) => job(queue, { i })));
        const claimers = await openExtra(8);
        const seen: string[] = [];
        await Promise.all(
          claimers.map(async (claimer, index) => {
            for (;;) {
              const limit = 1 + ((index * 7 + seen.length) % 20);
              const claimed = await claimer.claim({ queue, limit, leaseMs: 60_000, workerId: `w${index}` });
              if (claimed.length === 0) {
                // Empty means "nothing for this attempt", not "no work left": confirm before stopping.
                if (!(await claimer.hasClaimableWork(queue))) return;
                continue;
              }
              for (const c of claimed) seen.push(c.id);
              const done = await claimer.complete(claimed.map((c) => ({ id: c.id, claimToken: c.claimToken })));
              expect(done.every((d) => d.outcome === 'ok')).toBe(true);
            }
          }),
        );
        expect(seen).toHaveLength(total);
        expect(new Set(seen).size).toBe(total);
        const stats = await store.stats(queue);
        expect(stats).toMatchObject({ ready: 0, leased: 0, dead: 0 });
      });

      it('gives each claimed job a fresh token, a lease on the database clock and attempt 1', async () => {
        const queue = newQueue('lease');
        await store.enqueue([job(queue, { a: 1 }), job(queue, { a: 2 })]);
        const claimed = await store.claim({ queue, limit: 5, leaseMs: 45_000, workerId: WORKER });
        expect(claimed).toHaveLength(2);
        expect(new Set(claimed.map((c) => c.claimToken)).size).toBe(2);
        for (const c of claimed) {
          expect(c.attempt).toBe(1);
          expect(c.claimToken).toMatch(/^[0-9a-f-]{36}$/i);
          const leaseMs = c.leaseUntil.getTime() - c.claimedAt.getTime();
          expect(leaseMs).toBeGreaterThanOrEqual(44_990);
          expect(leaseMs).toBeLessThanOrEqual(45_010);
          const record = await store.getJob(c.id);
          expect(record).toMatchObject({ state: 'leased', claimToken: c.claimToken, workerId: WORKER, attempts: 1 });
        }
        expect(await store.claim({ queue, limit: 5, leaseMs: 1000, workerId: WORKER })).toEqual([]);
      });

      it('does not claim a delayed job before its time, and does after', async () => {
        const queue = newQueue('delay');
        const [later] = await store.enqueue([job(queue, { when: 'later' }, { delayMs: 60_000 })]);
        const [future] = await store.enqueue([
          job(queue, { when: 'future' }, { runAt: new Date(Date.now() + 3_600_000) }),
        ]);
        const [soon] = await store.enqueue([job(queue, { when: 'soon' }, { delayMs: 300 })]);
        expect((await store.getJob(soon!.jobId))!.state).toBe('delayed');
        expect(await store.hasClaimableWork(queue)).toBe(false);
        expect(await store.claim({ queue, limit: 10, leaseMs: 1000, workerId: WORKER })).toEqual([]);
        const stats = await store.stats(queue);
        expect(stats).toMatchObject({ ready: 0, delayed: 3 });
        // Due but not promoted yet (no claim since): counted as ready, and the probe sees it.
        await waitFor(
          () => store.stats(queue),
          (s) => s.ready === 1,
          { what: 'the 300 ms delayed job to be due' },
        );
        expect((await store.getJob(soon!.jobId))!.state).toBe('delayed');
        expect(await store.hasClaimableWork(queue)).toBe(true);
        const claimed = await waitFor(
          () => store.claim({ queue, limit: 10, leaseMs: 1000, workerId: WORKER }),
          (c) => c.length > 0,
          { what: 'the 300 ms delayed job' },
        );
        expect(claimed.map((c) => c.id)).toEqual([soon!.jobId]);
        const lateRecord = await store.getJob(later!.jobId);
        expect(lateRecord!.runAt.getTime() - lateRecord!.createdAt.getTime()).toBeGreaterThanOrEqual(59_990);
        expect((await store.getJob(future!.jobId))!.state).toBe('delayed');
        // A run-at in the past is due at once.
        const [past] = await store.enqueue([job(queue, {}, { runAt: new Date(Date.now() - 60_000) })]);
        expect((await store.getJob(past!.jobId))!.state).toBe('ready');
        expect((await claimOne(queue)).id).toBe(past!.jobId);
      });

      it('the first claim after delayed jobs are due promotes them and leases in priority order with ready ones', async () => {
        const queue = newQueue('promote');
        const [plain] = await store.enqueue([job(queue, { n: 'plain' }, { delayMs: 200 })]);
        const [high] = await store.enqueue([job(queue, { n: 'high' }, { priority: 5, delayMs: 200 })]);
        const [top, low] = await store.enqueue([
          job(queue, { n: 'top' }, { priority: 9 }),
          job(queue, { n: 'low' }, { priority: -1 }),
        ]);
        expect((await store.getJob(high!.jobId))!.state).toBe('delayed');
        expect((await store.getJob(top!.jobId))!.state).toBe('ready');
        await waitFor(
          () => store.stats(queue),
          (s) => s.delayed === 0,
          { what: 'the delayed jobs to be due' },
        );
        // limit 1: the oldest due delayed job (plain) is read with the best ready one (top); top
        // is leased, plain promoted to ready without being leased.
        expect((await claimOne(queue)).id).toBe(top!.jobId);
        expect(await store.getJob(plain!.jobId)).toMatchObject({ state: 'ready', attempts: 0, claimToken: null });
        expect((await store.getJob(high!.jobId))!.state).toBe('delayed');
        // A due delayed job is leased straight away when it is the best due job.
        const second = await claimOne(queue);
        expect([second.id, second.attempt]).toEqual([high!.jobId, 1]);
        const rest = await store.claim({ queue, limit: 10, leaseMs: 1000, workerId: WORKER });
        expect(rest.map((c) => c.id)).toEqual([plain!.jobId, low!.jobId]);
        expect(rest.map((c) => c.attempt)).toEqual([1, 1]);
      });

      it('a large delayed backlog of higher priority is not in the way of due jobs', async () => {
        const queue = newQueue('backlog');
        const delayed = Math.round(10_000 * target.scale);
        await store.enqueue(
          Array.from({ length: delayed }, (_, i) => job(queue, { i }, { priority: 5, delayMs: 3_600_000 })),
        );
        const due = await store.enqueue([job(queue, { d: 1 }), job(queue, { d: 2 }), job(queue, { d: 3 })]);
        const claimed = await store.claim({ queue, limit: 2, leaseMs: 30_000, workerId: WORKER });
        expect(claimed.map((c) => c.id)).toEqual(due.slice(0, 2).map((d) => d.jobId));
        expect(await store.stats(queue)).toMatchObject({ ready: 1, delayed, leased: 2 });
        expect((await claimOne(queue)).id).toBe(due[2]!.jobId);
        expect(await store.claim({ queue, limit: 10, leaseMs: 1000, workerId: WORKER })).toEqual([]);
      });

      it('claims higher priority first, then older run-at', async () => {
        const queue = newQueue('prio');
        const results = await store.enqueue([
          job(queue, { name: 'low' }, { priority: -5 }),
          job(queue, { name: 'normal-1' }),
          job(queue, { name: 'high' }, { priority: 10 }),
          job(queue, { name: 'normal-2' }),
        ]);
        expect(results).toHaveLength(4);
        const order: unknown[] = [];
        for (let i = 0; i < 4; i++) order.push(((await claimOne(queue)).payload as { name: string }).name);
        expect(order).toEqual(['high', 'normal-1', 'normal-2', 'low']);
      });

      it('claims only from the named queue', async () => {
        const a = newQueue('iso-a');
        const b = newQueue('iso-b');
        await store.enqueue([job(a, { q: 'a' })]);
        expect(await store.claim({ queue: b, limit: 10, leaseMs: 1000, workerId: WORKER })).toEqual([]);
        expect((await claimOne(a)).payload).toEqual({ q: 'a' });
      });
    });

    describe('job control: pausing a queue (issue 23)', () => {
      it('a paused queue leases nothing (ready, due delayed, grouped), reports paused, and claims again once resumed', async () => {
        const queue = newQueue('paused');
        const other = newQueue('unpaused');
        await store.enqueue([
          job(queue, { n: 1 }),
          job(queue, { n: 2 }, { groupKey: 'g' }),
          job(queue, { n: 3 }, { delayMs: 1 }),
        ]);
        await store.enqueue([job(other, { n: 4 })]);
        expect(await store.pauseQueue(queue, 'incident 42')).toBe(true);
        // A second pause changes nothing and keeps the first reason.
        expect(await store.pauseQueue(queue, 'another reason')).toBe(false);
        await new Promise((resolve) => setTimeout(resolve, 20)); // the delayed job is due now
        expect(await store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: WORKER })).toEqual([]);
        expect(await store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: WORKER, groupBatchSize: 5 })).toEqual(
          [],
        );
        expect(await store.hasClaimableWork(queue)).toBe(false);
        // Enqueue still works, and other queues are not affected.
        await store.enqueue([job(queue, { n: 5 })]);
        expect((await store.claim({ queue: other, limit: 10, leaseMs: 30_000, workerId: WORKER })).length).toBe(1);
        const stats = await store.stats(queue);
        expect(stats).toMatchObject({ paused: true, ready: 4, leased: 0 });
        expect((await store.stats(other)).paused).toBe(false);
        const paused = (await store.listPausedQueues()).find((p) => p.queue === queue);
        expect(paused).toEqual({ queue, reason: 'incident 42', pausedAt: expect.any(Date) });
        expect(Math.abs(paused!.pausedAt.getTime() - Date.now())).toBeLessThan(60_000);
        const health = await store.queueHealth({ failureWindowMs: 60_000, repeatedFailures: 3 });
        expect(health.find((q) => q.queue === queue)?.paused).toBe(true);
        expect(health.find((q) => q.queue === other)?.paused).toBe(false);

        expect(await store.resumeQueue(queue)).toBe(true);
        expect(await store.resumeQueue(queue)).toBe(false);
        expect(await store.hasClaimableWork(queue)).toBe(true);
        const claimed = await store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: WORKER });
        expect(claimed.map((c) => (c.payload as { n: number }).n).sort()).toEqual([1, 2, 3, 5]);
        expect((await store.stats(queue)).paused).toBe(false);
        expect((await store.listPausedQueues()).some((p) => p.queue === queue)).toBe(false);
      });

      it('jobs leased before the pause heartbeat, complete and fail as usual while it lasts', async () => {
        const queue = newQueue('paused-running');
        await store.enqueue([job(queue, { n: 1 }), job(queue, { n: 2 })]);
        const [first, second] = await store.claim({ queue, limit: 2, leaseMs: 30_000, workerId: WORKER });
        expect(await store.pauseQueue(queue, null)).toBe(true);
        const owned = (c: ClaimedJob) => ({ id: c.id, claimToken: c.claimToken });
        const [beat] = await store.heartbeat([{ ...owned(first!), leaseMs: 30_000, maxDurationMs: null }]);
        expect(beat).toMatchObject({ id: first!.id, outcome: 'ok' });
        expect(await store.complete([owned(first!)])).toEqual([{ id: first!.id, outcome: 'ok' }]);
        expect((await store.fail([failure(second!, 'boom')]))[0]?.outcome).toBe('ok');
        // The failed job is ready again, and waits for the resume.
        expect(await store.claim({ queue, limit: 2, leaseMs: 30_000, workerId: WORKER })).toEqual([]);
        expect((await store.listPausedQueues()).find((p) => p.queue === queue)?.reason).toBeNull();
        await store.resumeQueue(queue);
        expect((await store.claim({ queue, limit: 2, leaseMs: 30_000, workerId: WORKER })).map((c) => c.id)).toEqual([
          second!.id,
        ]);
      });

      it('a paused queue with no jobs is still listed by queueHealth, as paused', async () => {
        const queue = newQueue('paused-empty');
        await store.pauseQueue(queue, 'empty');
        const health = await store.queueHealth({ failureWindowMs: 60_000, repeatedFailures: 3 });
        expect(health.find((q) => q.queue === queue)).toMatchObject({ queue, ready: 0, paused: true });
        await store.resumeQueue(queue);
      });
    });

    describe('job control: canceling jobs (issue 23)', () => {
      const lease = (queue: string, limit = 10) => store.claim({ queue, limit, leaseMs: 30_000, workerId: WORKER });
      const beat = (c: ClaimedJob) =>
        store.heartbeat([{ id: c.id, claimToken: c.claimToken, leaseMs: 30_000, maxDurationMs: null }]);

      it('cancels ready and delayed jobs at once: they never run; finished and missing ones are reported and left alone', async () => {
        const queue = newQueue('cancel');
        const [ready, delayed, other] = await store.enqueue([
          job(queue, { n: 1 }),
          job(queue, { n: 2 }, { delayMs: 3_600_000 }),
          job(queue, { n: 3 }, { idempotencyKey: 'k-3' }),
        ]);
        const results = await store.cancel([delayed!.jobId, ready!.jobId, ready!.jobId, '999999999'], 'not needed');
        expect(results).toEqual([
          { id: delayed!.jobId, queue, outcome: 'canceled', state: 'canceled' },
          { id: ready!.jobId, queue, outcome: 'canceled', state: 'canceled' },
          { id: '999999999', queue: null, outcome: 'missing', state: null },
        ]);
        const record = await store.getJob(ready!.jobId);
        expect(record).toMatchObject({ state: 'canceled', cancelReason: 'not needed', finishedAt: expect.any(Date) });
        expect(record!.cancelRequestedAt).toBeInstanceOf(Date);
        // Only the third job is claimable; the canceled ones stay canceled.
        expect((await lease(queue)).map((c) => c.id)).toEqual([other!.jobId]);
        expect(await store.cancel([ready!.jobId], 'again')).toEqual([
          { id: ready!.jobId, queue, outcome: 'finished', state: 'canceled' },
        ]);
        expect((await store.getJob(ready!.jobId))!.cancelReason).toBe('not needed');
        expect(await store.findJobByKey(queue, 'k-3')).toBe(other!.jobId);
        expect(await store.findJobByKey(queue, 'no-such-key')).toBeNull();
      });

      it('marks a leased job; its heartbeat reports the request; the owner records it as canceled and can no longer complete', async () => {
        const queue = newQueue('cancel-leased');
        await store.enqueue([job(queue, { n: 1 })]);
        const [claimed] = await lease(queue, 1);
        expect(await store.cancel([claimed!.id], 'operator')).toEqual([
          { id: claimed!.id, queue, outcome: 'canceling', state: 'leased' },
        ]);
        const [reply] = await beat(claimed!);
        expect(reply).toMatchObject({ id: claimed!.id, outcome: 'ok', cancel: { reason: 'operator' } });
        const ack = { ...failure(claimed!, 'job canceled: operator'), canceled: true };
        expect(await store.fail([ack])).toEqual([{ id: claimed!.id, outcome: 'ok', state: 'canceled' }]);
        expect(await store.fail([ack])).toEqual([{ id: claimed!.id, outcome: 'already', state: null }]);
        expect(await store.complete([{ id: claimed!.id, claimToken: claimed!.claimToken }])).toEqual([
          { id: claimed!.id, outcome: 'lost' },
        ]);
        expect((await store.getJob(claimed!.id))!.state).toBe('canceled');
        const attempts = await store.getAttempts(claimed!.id);
        expect(attempts.map((a) => a.outcome)).toEqual(['canceled']);
        expect(await lease(queue)).toEqual([]);
      });

      it('a marked job is never retried: its failure, its give-back and its expired lease all end it canceled', async () => {
        const queue = newQueue('cancel-paths');
        await store.enqueue([job(queue, { n: 1 }), job(queue, { n: 2 }), job(queue, { n: 3 })]);
        const [a, b, c] = await lease(queue, 3);
        await store.cancel([a!.id, b!.id, c!.id], null);
        expect((await store.fail([failure(a!, 'boom')]))[0]).toMatchObject({ outcome: 'ok', state: 'canceled' });
        expect(await store.release([{ id: b!.id, claimToken: b!.claimToken }])).toEqual([{ id: b!.id, outcome: 'ok' }]);
        expect((await store.getJob(a!.id))!.state).toBe('canceled');
        expect((await store.getJob(b!.id))!.state).toBe('canceled');
        // A job whose owner completed before it heard of the cancellation is done: its work happened.
        expect(await store.complete([{ id: c!.id, claimToken: c!.claimToken }])).toEqual([
          { id: c!.id, outcome: 'ok' },
        ]);
        expect((await store.getJob(c!.id))!.state).toBe('done');

        await store.enqueue([job(queue, { n: 4 })]);
        const [d] = await store.claim({ queue, limit: 1, leaseMs: 200, workerId: WORKER });
        await store.cancel([d!.id], 'owner died');
        await waitFor(
          async () => {
            await store.reap(100);
            return (await store.getJob(d!.id))?.state;
          },
          (state) => state === 'canceled',
          { what: 'the marked job with an expired lease to be reaped as canceled' },
        );
        expect(await lease(queue)).toEqual([]);
      });

      it('in an ordered group: a canceled head lets the next job go, a canceled job behind a running one is skipped, an acknowledged cancellation releases the group', async () => {
        const queue = newQueue('cancel-group');
        const [g1, g2, g3, g4] = await store.enqueue([1, 2, 3, 4].map((n) => job(queue, { n }, { groupKey: 'g' })));
        expect((await store.cancel([g1!.jobId], null))[0]!.outcome).toBe('canceled');
        const [head] = await lease(queue);
        expect(head!.id).toBe(g2!.jobId);
        // g3 waits behind the running g2: canceled at once, and skipped when g2 completes.
        expect((await store.cancel([g3!.jobId], null))[0]!.outcome).toBe('canceled');
        await store.complete([{ id: head!.id, claimToken: head!.claimToken }]);
        const [next] = await lease(queue);
        expect(next!.id).toBe(g4!.jobId);
        // The running g4 is canceled through its owner: the group is released, then empty.
        await store.cancel([g4!.jobId], null);
        await store.fail([{ ...failure(next!, 'canceled'), canceled: true }]);
        const [g5] = await store.enqueue([job(queue, { n: 5 }, { groupKey: 'g' })]);
        // The emptied group is settled in the background (as after a completion that empties
        // it): the new job is claimable once that has run, within moments.
        const claimed = await waitFor(
          () => lease(queue),
          (jobs) => jobs.length > 0,
          { what: 'the next job of the released group to be claimable', timeoutMs: 5_000 },
        );
        expect(claimed.map((c) => c.id)).toEqual([g5!.jobId]);
      });

      it("stores each completion's result in the completion statement, and getJob returns it parsed", async () => {
        const queue = newQueue('results');
        await store.enqueue([job(queue, { n: 1 }), job(queue, { n: 2 }), job(queue, { n: 3 })]);
        const [a, b, c] = await lease(queue, 3);
        const own = (x: ClaimedJob) => ({ id: x.id, claimToken: x.claimToken });
        const value = { url: 's3://bucket/report.pdf', pages: 12, nested: { ok: true, text: 'ü€𝄞' } };
        expect(
          await store.complete([
            { ...own(a!), result: JSON.stringify(value) },
            { ...own(b!), result: null },
            { ...own(c!), result: JSON.stringify([1, 'two', null]) },
          ]),
        ).toEqual([a, b, c].map((x) => ({ id: x!.id, outcome: 'ok' })));
        expect((await store.getJob(a!.id))!.result).toEqual(value);
        expect((await store.getJob(b!.id))!.result).toBeNull();
        expect((await store.getJob(c!.id))!.result).toEqual([1, 'two', null]);
        // A retried completion whose reply was lost is 'already', and leaves the stored result as it was.
        expect(await store.complete([{ ...own(a!), result: JSON.stringify({ other: 1 }) }])).toEqual([
          { id: a!.id, outcome: 'already' },
        ]);
        expect((await store.getJob(a!.id))!.result).toEqual(value);
      });

      it('retention deletes canceled jobs as it deletes done ones', async () => {
        const queue = newQueue('cancel-retention');
        const [one] = await store.enqueue([job(queue, { n: 1 })]);
        await store.cancel([one!.jobId], null);
        // Retention counts on the database clock: run it until the job is older than 1 ms.
        await waitFor(
          async () => {
            await store.cleanup({
              doneRetentionMs: 1,
              deadRetentionMs: null,
              idempotencyRetentionMs: 1,
              batchSize: 1000,
            });
            return store.getJob(one!.jobId);
          },
          (record) => record === null,
          { what: 'retention to delete the canceled job' },
        );
      });
    });

    describe('ownership: complete, fail, heartbeat, release', () => {
      it('completes with the current token; a repeat with the same token is "already", not lost', async () => {
        const queue = newQueue('done');
        await store.enqueue([job(queue, {})]);
        const claimed = await claimOne(queue);
        const owned = { id: claimed.id, claimToken: claimed.claimToken };
        expect(await store.complete([owned])).toEqual([{ id: claimed.id, outcome: 'ok' }]);
        expect(await store.complete([owned])).toEqual([{ id: claimed.id, outcome: 'already' }]);
        const record = await store.getJob(claimed.id);
        expect(record).toMatchObject({ state: 'done', leaseUntil: null });
        expect(record!.finishedAt).toBeInstanceOf(Date);
        const attempts = await store.getAttempts(claimed.id);
        expect(attempts.map((a) => a.outcome)).toEqual(['completed']);
      });

      it('refuses a stale token after reap and re-claim: complete, fail and heartbeat are all lost', async () => {
        const queue = newQueue('stale');
        await store.enqueue([job(queue, { x: 1 })]);
        const first = await claimOne(queue, 1);
        await reapUntil(queue, first.id);
        const second = await claimOne(queue, 60_000);
        expect(second.id).toBe(first.id);
        expect(second.claimToken).not.toBe(first.claimToken);
        expect(second.attempt).toBe(2);

        const stale = { id: first.id, claimToken: first.claimToken };
        expect(await store.complete([stale])).toEqual([{ id: first.id, outcome: 'lost' }]);
        expect(await store.fail([failure(stale, 'stale')])).toEqual([{ id: first.id, outcome: 'lost', state: null }]);
        expect(await store.heartbeat([{ ...stale, leaseMs: 60_000, maxDurationMs: null }])).toEqual([
          { id: first.id, outcome: 'lost', leaseUntil: null },
        ]);
        expect(await store.release([stale])).toEqual([{ id: first.id, outcome: 'lost' }]);

        // The new owner is untouched by all of that.
        const record = await store.getJob(first.id);
        expect(record).toMatchObject({ state: 'leased', claimToken: second.claimToken });
        expect(await store.complete([{ id: second.id, claimToken: second.claimToken }])).toEqual([
          { id: second.id, outcome: 'ok' },
        ]);
        const history = await store.getAttempts(first.id);
        expect(history.map((a) => a.outcome)).toEqual(['lease-expired', 'completed']);
      });

      it('heartbeat extends the lease with the same token, bounded by the maximum duration', async () => {
        const queue = newQueue('hb');
        await store.enqueue([job(queue, {})]);
        const claimed = await claimOne(queue, 2_000);
        const [extended] = await store.heartbeat([
          { id: claimed.id, claimToken: claimed.claimToken, leaseMs: 120_000, maxDurationMs: null },
        ]);
        expect(extended!.outcome).toBe('ok');
        expect(extended!.leaseUntil!.getTime()).toBeGreaterThan(claimed.leaseUntil.getTime() + 100_000);
        const [capped] = await store.heartbeat([
          { id: claimed.id, claimToken: claimed.claimToken, leaseMs: 120_000, maxDurationMs: 10_000 },
        ]);
        expect(capped!.leaseUntil!.getTime()).toBeLessThanOrEqual(claimed.claimedAt.getTime() + 10_000 + 5);
        expect((await store.getJob(claimed.id))!.claimToken).toBe(claimed.claimToken);
      });

      it('a retry backing off waits as delayed and is claimed again once due', async () => {
        const queue = newQueue('backoff');
        await store.enqueue([job(queue, { n: 1 })]);
        const claimed = await claimOne(queue);
        const [result] = await store.fail([failure(claimed, 'busy', { retryDelayMs: 200 })]);
        expect(result).toEqual({ id: claimed.id, outcome: 'ok', state: 'delayed' });
        const again = await waitFor(
          () => store.claim({ queue, limit: 1, leaseMs: 1000, workerId: WORKER }),
          (c) => c.length > 0,
          { what: 'the retry after its 200 ms backoff' },
        );
        expect(again.map((c) => [c.id, c.attempt])).toEqual([[claimed.id, 2]]);
      });

      it('fail schedules a retry after the given delay and records the attempt', async () => {
        const queue = newQueue('retry');
        await store.enqueue([job(queue, { n: 1 })]);
        const claimed = await claimOne(queue);
        const [result] = await store.fail([
          {
            id: claimed.id,
            claimToken: claimed.claimToken,
            error: 'smtp refused',
            stack: 'Error: smtp refused\n    at send',
            retryDelayMs: 60_000,
            dead: false,
            workerId: 'w-fail',
          },
        ]);
        expect(result).toEqual({ id: claimed.id, outcome: 'ok', state: 'delayed' });
        const record = await store.getJob(claimed.id);
        expect(record).toMatchObject({ state: 'delayed', lastError: 'smtp refused', claimToken: null, attempts: 1 });
        expect(record!.runAt.getTime()).toBeGreaterThan(Date.now() + 50_000);
        expect(await store.claim({ queue, limit: 1, leaseMs: 1000, workerId: WORKER })).toEqual([]);
        const stats = await store.stats(queue);
        expect(stats).toMatchObject({ ready: 0, delayed: 1, retrying: 1 });
        const [attempt] = await store.getAttempts(claimed.id);
        expect(attempt).toMatchObject({
          attempt: 1,
          outcome: 'failed',
          error: 'smtp refused',
          stack: 'Error: smtp refused\n    at send',
          workerId: 'w-fail',
        });
        expect(attempt!.startedAt).toBeInstanceOf(Date);
        // A retried fail whose first reply was lost is recognised.
        const [again] = await store.fail([
          {
            id: claimed.id,
            claimToken: claimed.claimToken,
            error: 'x',
            stack: null,
            retryDelayMs: 0,
            dead: false,
            workerId: 'w',
          },
        ]);
        expect(again!.outcome).toBe('already');
      });

      it('moves a job to dead after maxAttempts, keeping the last error; dead at once when unrecoverable', async () => {
        const queue = newQueue('dead');
        const [doomed] = await store.enqueue([job(queue, { n: 1 }, { maxAttempts: 2 })]);
        for (let attempt = 1; attempt <= 2; attempt++) {
          const claimed = await claimOne(queue);
          expect(claimed.attempt).toBe(attempt);
          const [result] = await store.fail([failure(claimed, `boom ${attempt}`)]);
          expect(result!.state).toBe(attempt === 2 ? 'dead' : 'ready');
        }
        const record = await store.getJob(doomed!.jobId);
        expect(record).toMatchObject({ state: 'dead', lastError: 'boom 2', attempts: 2 });
        expect(record!.finishedAt).toBeInstanceOf(Date);

        const [poison] = await store.enqueue([job(queue, { n: 2 }, { maxAttempts: 10 })]);
        const claimed = await claimOne(queue);
        expect(claimed.id).toBe(poison!.jobId);
        const [result] = await store.fail([failure(claimed, 'invalid payload', { dead: true })]);
        expect(result!.state).toBe('dead');
        expect((await store.stats(queue)).dead).toBe(2);
      });

      it('release gives a never-started job back without counting the attempt', async () => {
        const queue = newQueue('release');
        await store.enqueue([job(queue, {})]);
        const claimed = await claimOne(queue);
        expect(await store.release([{ id: claimed.id, claimToken: claimed.claimToken }])).toEqual([
          { id: claimed.id, outcome: 'ok' },
        ]);
        expect(await store.getJob(claimed.id)).toMatchObject({ state: 'ready', attempts: 0, claimToken: null });
        expect((await claimOne(queue)).attempt).toBe(1);
      });

      it('a give-back with a delay postpones the job: delayed until then, its attempt given back and not recorded; its group waits for it', async () => {
        const claimAll = (queue: string) => store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: WORKER });
        const queue = newQueue('postpone');
        await store.enqueue([job(queue, {})]);
        const claimed = await claimOne(queue);
        expect(await store.release([{ id: claimed.id, claimToken: claimed.claimToken, delayMs: 500 }])).toEqual([
          { id: claimed.id, outcome: 'ok' },
        ]);
        expect(await store.getJob(claimed.id)).toMatchObject({ state: 'delayed', attempts: 0, claimToken: null });
        expect(await store.getAttempts(claimed.id)).toEqual([]);
        expect(await claimAll(queue)).toEqual([]);
        const [again] = await waitFor(
          () => claimAll(queue),
          (jobs) => jobs.length > 0,
          { what: 'the postponed job to be claimable once due', timeoutMs: 5_000 },
        );
        expect(again).toMatchObject({ id: claimed.id, attempt: 1 });

        const grouped = newQueue('postpone-group');
        const [g1, g2] = await store.enqueue([1, 2].map((n) => job(grouped, { n }, { groupKey: 'g' })));
        const [head] = await claimAll(grouped);
        expect(head!.id).toBe(g1!.jobId);
        await store.release([{ id: head!.id, claimToken: head!.claimToken, delayMs: 500 }]);
        // The next job of the group does not pass the postponed head.
        expect(await claimAll(grouped)).toEqual([]);
        const [next] = await waitFor(
          () => claimAll(grouped),
          (jobs) => jobs.length > 0,
          { what: 'the postponed head to be claimable once due', timeoutMs: 5_000 },
        );
        expect(next).toMatchObject({ id: g1!.jobId, attempt: 1 });
        expect(g2).toBeDefined();
      });

      it('batches many owners in one call, each checked on its own token', async () => {
        const queue = newQueue('batch');
        await store.enqueue(Array.from({ length: 6 }, (_, i) => job(queue, { i })));
        const claimed = await store.claim({ queue, limit: 6, leaseMs: 60_000, workerId: WORKER });
        expect(claimed).toHaveLength(6);
        const [a, b, c, d, e, f] = claimed as [ClaimedJob, ClaimedJob, ClaimedJob, ClaimedJob, ClaimedJob, ClaimedJob];
        const results = await store.complete([
          { id: a.id, claimToken: a.claimToken },
          { id: b.id, claimToken: c.claimToken }, // someone else's token
          { id: c.id, claimToken: c.claimToken },
        ]);
        expect(results).toEqual(
          expect.arrayContaining([
            { id: a.id, outcome: 'ok' },
            { id: b.id, outcome: 'lost' },
            { id: c.id, outcome: 'ok' },
          ]),
        );
        const failed = await store.fail([
          failure(d, 'e1'),
          {
            id: e.id,
            claimToken: f.claimToken,
            error: 'e2',
            stack: null,
            retryDelayMs: 0,
            dead: false,
            workerId: WORKER,
          },
        ]);
        expect(failed).toEqual(
          expect.arrayContaining([
            { id: d.id, outcome: 'ok', state: 'ready' },
            { id: e.id, outcome: 'lost', state: null },
          ]),
        );
        const beats = await store.heartbeat([
          { id: e.id, claimToken: e.claimToken, leaseMs: 60_000, maxDurationMs: null },
          { id: f.id, claimToken: a.claimToken, leaseMs: 60_000, maxDurationMs: null },
        ]);
        expect(beats.find((x) => x.id === e.id)!.outcome).toBe('ok');
        expect(beats.find((x) => x.id === f.id)!.outcome).toBe('lost');
      });
    });

    describe('reaper', () => {
      it('returns expired leases to ready with a lease-expired attempt, and only expired ones', async () => {
        const queue = newQueue('reap');
        await store.enqueue([job(queue, { short: true }), job(queue, { short: false })]);
        const short = await claimOne(queue, 1);
        const long = await claimOne(queue, 600_000);
        await reapUntil(queue, short.id);
        const record = await store.getJob(short.id);
        expect(record).toMatchObject({ state: 'ready', claimToken: null, leaseUntil: null, attempts: 1 });
        expect(record!.lastError).toMatch(/lease expired/);
        const [attempt] = await store.getAttempts(short.id);
        expect(attempt).toMatchObject({ attempt: 1, outcome: 'lease-expired', workerId: WORKER });
        expect((await store.getJob(long.id))!.state).toBe('leased');
      });

      it('moves an expired lease to dead when its attempts are used up', async () => {
        const queue = newQueue('reapdead');
        const [enqueued] = await store.enqueue([job(queue, {}, { maxAttempts: 1 })]);
        await claimOne(queue, 1);
        await reapUntil(queue, enqueued!.jobId);
        expect(await store.getJob(enqueued!.jobId)).toMatchObject({ state: 'dead', attempts: 1 });
        expect((await store.getJob(enqueued!.jobId))!.lastError).toMatch(/lease expired/);
      });

      it('is safe with several reapers at once: each expired lease is reaped once', async () => {
        const queue = newQueue('reapers');
        const count = Math.round(200 * target.scale);
        await store.enqueue(Array.from({ length: count }, (_, i) => job(queue, { i })));
        await store.claim({ queue, limit: count, leaseMs: 1, workerId: WORKER });
        const reapers = await openExtra(4);
        await waitFor(
          async () => (await store.stats(queue)).expiredLeases,
          (n) => n === count,
          {
            what: 'all leases to expire',
          },
        );
        const reaped = (await Promise.all(reapers.map((r) => r.reap(25)))).flat();
        let more = reaped;
        while (more.length > 0) {
          more = (await Promise.all(reapers.map((r) => r.reap(25)))).flat();
          reaped.push(...more);
        }
        const mine = reaped.filter((r) => r.queue === queue);
        expect(mine).toHaveLength(count);
        expect(new Set(mine.map((r) => r.id)).size).toBe(count);
        expect((await store.stats(queue)).ready).toBe(count);
      });
    });

    describe('stats and administration', () => {
      it('reports ready, delayed, leased, expired leases, dead, retrying and oldest ready age', async () => {
        const queue = newQueue('stats');
        const empty = await store.stats(queue);
        expect(empty).toEqual({
          queue,
          ready: 0,
          delayed: 0,
          leased: 0,
          expiredLeases: 0,
          dead: 0,
          retrying: 0,
          blockedGroups: 0,
          oldestReadyAgeMs: 0,
          paused: false,
        });
        await store.enqueue([job(queue, { old: true }, { runAt: new Date(Date.now() - 120_000) })]);
        await store.enqueue([job(queue, { a: 1 }), job(queue, { a: 2 }), job(queue, { a: 3 }), job(queue, { a: 4 })]);
        await store.enqueue([job(queue, {}, { delayMs: 600_000 })]);
        const oldest = await claimOne(queue, 1); // the old one, soon expired
        const leased = await claimOne(queue, 600_000);
        const toFail = await claimOne(queue, 600_000);
        await store.fail([failure(toFail, 'x', { dead: true })]);
        const toRetry = await claimOne(queue, 600_000);
        await store.fail([failure(toRetry, 'y')]);
        await waitFor(
          async () => (await store.stats(queue)).expiredLeases,
          (n) => n === 1,
          { what: 'one expired lease' },
        );
        const stats = await store.stats(queue);
        expect(stats).toMatchObject({ ready: 2, delayed: 1, leased: 2, expiredLeases: 1, dead: 1, retrying: 1 });
        expect(stats.oldestReadyAgeMs).toBeGreaterThan(0);
        expect(oldest.id).not.toBe(leased.id);
        // The oldest ready job now is one enqueued moments ago, not the two-minute-old leased one.
        expect(stats.oldestReadyAgeMs).toBeLessThan(60_000);
        await store.reap(100);
        const after = await store.stats(queue);
        expect(after.oldestReadyAgeMs).toBeGreaterThanOrEqual(110_000);
      });

      it('lists dead jobs in pages, retries them and purges them', async () => {
        const queue = newQueue('deadadmin');
        await store.enqueue(Array.from({ length: 5 }, (_, i) => job(queue, { i }, { maxAttempts: 1 })));
        const claimed = await store.claim({ queue, limit: 5, leaseMs: 60_000, workerId: WORKER });
        await store.fail(claimed.map((c) => failure(c, `e${c.id}`)));
        const page1 = await store.listDead(queue, { limit: 3 });
        expect(page1.jobs).toHaveLength(3);
        expect(page1.nextAfterId).toBe(page1.jobs[2]!.id);
        const page2 = await store.listDead(queue, { limit: 3, afterId: page1.nextAfterId });
        expect(page2.jobs).toHaveLength(2);
        expect(page2.nextAfterId).toBeNull();
        const all = [...page1.jobs, ...page2.jobs];
        expect(all.every((j) => j.state === 'dead' && j.lastError === `e${j.id}`)).toBe(true);

        const retried = await store.retryDead(queue, [all[0]!.id, '999999999999']);
        expect(retried).toEqual([all[0]!.id]);
        expect(await store.getJob(all[0]!.id)).toMatchObject({ state: 'ready', attempts: 0 });
        expect((await claimOne(queue)).id).toBe(all[0]!.id);

        expect(await store.purgeDead(queue, { olderThanMs: 3_600_000 })).toBe(0);
        expect(await store.purgeDead(queue)).toBe(4);
        expect((await store.stats(queue)).dead).toBe(0);
        expect(await store.getJob(all[1]!.id)).toBeNull();
      });

      it('purges only the given dead jobs of the queue; ids of other queues or of live jobs are left alone', async () => {
        const queue = newQueue('purgeids');
        const other = newQueue('purgeids-other');
        await store.enqueue(Array.from({ length: 3 }, (_, i) => job(queue, { i }, { maxAttempts: 1 })));
        const dead = await store.claim({ queue, limit: 3, leaseMs: 60_000, workerId: WORKER });
        await store.fail(dead.map((c) => failure(c, 'e', { dead: true })));
        const [live] = await store.enqueue([job(queue, { live: true })]);
        await store.enqueue([job(other, {}, { maxAttempts: 1 })]);
        const otherDead = await claimOne(other);
        await store.fail([failure(otherDead, 'e', { dead: true })]);
        const [a, b, c] = dead.map((d) => d.id);

        expect(await store.purgeDead(queue, { ids: [] })).toBe(0);
        expect(await store.purgeDead(queue, { ids: [a!, c!, otherDead.id, live!.jobId, '999999999999'] })).toBe(2);
        expect(await store.getJob(a!)).toBeNull();
        expect(await store.getJob(c!)).toBeNull();
        expect(await store.getJob(b!)).toMatchObject({ state: 'dead' });
        expect(await store.getJob(otherDead.id)).toMatchObject({ state: 'dead' });
        expect(await store.getJob(live!.jobId)).toMatchObject({ state: 'ready' });
        // With an age too: only those of the ids dead long enough.
        expect(await store.purgeDead(queue, { ids: [b!], olderThanMs: 3_600_000 })).toBe(0);
        expect(await store.purgeDead(queue, { ids: [b!] })).toBe(1);
        expect((await store.stats(queue)).dead).toBe(0);
      });

      it('purging a blocking dead job by id releases its ordered group, and only that group', async () => {
        const queue = newQueue('purgeidgroup');
        await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'block' }]);
        const ids = (
          await store.enqueue([
            job(queue, { n: 1 }, { groupKey: 'a', maxAttempts: 1 }),
            job(queue, { n: 2 }, { groupKey: 'a' }),
            job(queue, { n: 3 }, { groupKey: 'b', maxAttempts: 1 }),
            job(queue, { n: 4 }, { groupKey: 'b' }),
          ])
        ).map((r) => r.jobId);
        const heads = await store.claim({ queue, limit: 10, leaseMs: 60_000, workerId: WORKER });
        expect(heads.map((h) => h.id).sort()).toEqual([ids[0], ids[2]].sort());
        await store.fail(heads.map((h) => failure(h, 'dies')));
        expect((await store.stats(queue)).blockedGroups).toBe(2);
        expect(await store.claim({ queue, limit: 10, leaseMs: 60_000, workerId: WORKER })).toEqual([]);

        expect(await store.purgeDead(queue, { ids: [ids[0]!] })).toBe(1);
        expect((await store.listBlockedGroups(queue, { limit: 10 })).groups.map((g) => g.groupKey)).toEqual(['b']);
        const next = await store.claim({ queue, limit: 10, leaseMs: 60_000, workerId: WORKER });
        expect(next.map((c) => c.id)).toEqual([ids[1]]);
      });

      it('pages dead jobs in id order across digit boundaries (ids sort as numbers, not text)', async () => {
        const queue = newQueue('deadpaging');
        // Enough jobs that their ids cross a power of ten wherever the sequence stands.
        const count = 120;
        await store.enqueue(Array.from({ length: count }, (_, i) => job(queue, { i }, { maxAttempts: 1 })));
        const claimed = await store.claim({ queue, limit: count, leaseMs: 60_000, workerId: WORKER });
        await store.fail(claimed.map((c) => failure(c, 'e', { dead: true })));
        const seen: string[] = [];
        let afterId: string | null = null;
        for (;;) {
          const page = await store.listDead(queue, { limit: 7, afterId });
          seen.push(...page.jobs.map((j) => j.id));
          if (!page.nextAfterId) break;
          afterId = page.nextAfterId;
        }
        const expected = claimed.map((c) => c.id).sort((a, b) => Number(a) - Number(b));
        expect(seen).toEqual(expected);
      });

      it('retries every dead job of a queue at once', async () => {
        const queue = newQueue('retryall');
        await store.enqueue(Array.from({ length: 3 }, (_, i) => job(queue, { i }, { maxAttempts: 1 })));
        const claimed = await store.claim({ queue, limit: 3, leaseMs: 60_000, workerId: WORKER });
        await store.fail(claimed.map((c) => failure(c, 'e', { dead: true })));
        expect((await store.retryDead(queue, 'all')).sort()).toEqual(claimed.map((c) => c.id).sort());
        expect((await store.stats(queue)).ready).toBe(3);
      });

      it('cleans up finished jobs, keeping idempotency keys for their window', async () => {
        const queue = newQueue('cleanup');
        const [plain] = await store.enqueue([job(queue, { plain: true })]);
        const [keyed] = await store.enqueue([job(queue, { keyed: true }, { idempotencyKey: 'k-1' })]);
        const [waiting] = await store.enqueue([job(queue, { waiting: true })]);
        const claimed = await store.claim({ queue, limit: 2, leaseMs: 60_000, workerId: WORKER });
        expect(claimed.map((c) => c.id).sort()).toEqual([plain!.jobId, keyed!.jobId].sort());
        await store.complete(claimed.map((c) => ({ id: c.id, claimToken: c.claimToken })));
        // Cleanup is global: it also removes other tests' old done jobs, so watch ours.
        const keepKeys = {
          doneRetentionMs: 1,
          idempotencyRetentionMs: 3_600_000,
          deadRetentionMs: null,
          batchSize: 1000,
        };
        await waitFor(
          async () => {
            await store.cleanup(keepKeys);
            return store.getJob(plain!.jobId);
          },
          (record) => record === null,
          { what: 'the keyless done job to pass its retention' },
        );
        expect(await store.getJob(keyed!.jobId)).not.toBeNull();
        expect(await store.getJob(waiting!.jobId)).not.toBeNull();
        const [again] = await store.enqueue([job(queue, {}, { idempotencyKey: 'k-1' })]);
        expect(again).toEqual({ jobId: keyed!.jobId, created: false });
        const dropKeys = { doneRetentionMs: 1, idempotencyRetentionMs: 1, deadRetentionMs: null, batchSize: 1000 };
        await waitFor(
          async () => {
            await store.cleanup(dropKeys);
            return store.getJob(keyed!.jobId);
          },
          (record) => record === null,
          { what: 'the keyed job to pass the idempotency window' },
        );
        expect(await store.getJob(waiting!.jobId)).not.toBeNull();
      });

      it('answers a ping within its time bound', async () => {
        await expect(store.ping(5_000)).resolves.toBeUndefined();
      });
    });

    describe('dashboard reads: jobs by state, throughput', () => {
      const HOUR = 3_600_000;

      /** Every page of a listing, `limit` at a time: the ids in order, and each page's size. */
      async function listAll(queue: string, state: ListedJobState, limit: number) {
        const ids: string[] = [];
        const sizes: number[] = [];
        const jobs: JobSummary[] = [];
        let cursor: string | null = null;
        for (let page = 0; page < 50; page++) {
          const result: JobListPage = await store.listJobs({ queue, state, limit, cursor });
          expect(result.scanLimited).toBe(false);
          jobs.push(...result.jobs);
          ids.push(...result.jobs.map((j) => j.id));
          sizes.push(result.jobs.length);
          if (result.nextCursor === null) return { ids, sizes, jobs };
          // Only a full page has a next one.
          expect(result.jobs).toHaveLength(limit);
          cursor = result.nextCursor;
        }
        throw new Error(`the ${state} listing of ${queue} did not end`);
      }

      const minuteOf = (date: Date) => new Date(Math.floor(date.getTime() / 60_000) * 60_000);

      it('lists ready jobs in claim order, then grouped ones by group key and id, in pages that join up', async () => {
        const queue = newQueue('list-ready');
        const now = Date.now();
        const [u1] = await store.enqueue([job(queue, { u: 1 }, { runAt: new Date(now - 60_000) })]);
        const [u2] = await store.enqueue([job(queue, { u: 2 }, { priority: 5 })]);
        // Same priority as u1, enqueued after it but due before it.
        const [u3] = await store.enqueue([job(queue, { u: 3 }, { runAt: new Date(now - 120_000) })]);
        const [gb1, ga1, ga2] = await store.enqueue([
          job(queue, { g: 'b1' }, { groupKey: 'b' }),
          job(queue, { g: 'a1' }, { groupKey: 'a' }),
          job(queue, { g: 'a2' }, { groupKey: 'a' }),
        ]);
        await store.enqueue([job(queue, { later: true }, { delayMs: HOUR })]);
        await store.enqueue([job(newQueue('list-ready-other'), {})]);

        const listed = await listAll(queue, 'ready', 2);
        expect(listed.ids).toEqual([u2, u3, u1, ga1, ga2, gb1].map((r) => r!.jobId));
        expect(listed.sizes).toEqual([2, 2, 2]);
        expect(listed.jobs.every((j) => j.state === 'ready' && j.queue === queue)).toBe(true);
        expect(listed.jobs.map((j) => j.groupKey)).toEqual([null, null, null, 'a', 'a', 'b']);
        expect(listed.jobs[0]).toMatchObject({ priority: 5, attempts: 0, maxAttempts: 3, lastErrorPreview: null });
        expect(JSON.parse(listed.jobs[0]!.payloadPreview)).toEqual({ u: 2 });
        // The ungrouped part is the order a claim takes.
        const claimed = await store.claim({ queue, limit: 1, leaseMs: 60_000, workerId: WORKER });
        expect(claimed.map((c) => c.id)).toEqual([u2!.jobId]);
        // Other page sizes list the same jobs.
        for (const limit of [1, 3, 500]) {
          expect((await listAll(queue, 'ready', limit)).ids).toEqual([u3, u1, ga1, ga2, gb1].map((r) => r!.jobId));
        }
      });

      it('lists delayed jobs by run time and id, then grouped ones by group key and id', async () => {
        const queue = newQueue('list-delayed');
        const at = (ms: number) => new Date(Date.now() + ms);
        const [d1] = await store.enqueue([job(queue, { d: 1 }, { runAt: at(2 * HOUR) })]);
        const sameTime = at(HOUR);
        const [d2] = await store.enqueue([job(queue, { d: 2 }, { runAt: sameTime })]);
        const [d3] = await store.enqueue([job(queue, { d: 3 }, { runAt: sameTime })]);
        const [ga1, ga2] = await store.enqueue([
          job(queue, { g: 1 }, { groupKey: 'a', delayMs: HOUR }),
          job(queue, { g: 2 }, { groupKey: 'a', delayMs: 3 * HOUR }),
        ]);
        await store.enqueue([job(queue, { due: true })]);

        const listed = await listAll(queue, 'delayed', 2);
        expect(listed.ids).toEqual([d2, d3, d1, ga1, ga2].map((r) => r!.jobId));
        expect(listed.sizes).toEqual([2, 2, 1]);
        expect(listed.jobs.every((j) => j.state === 'delayed')).toBe(true);
        expect(listed.jobs[0]!.runAt.getTime()).toBe(sameTime.getTime());
      });

      it(`lists delayed jobs behind ${2 * GROUP_SCAN_LIMIT} grouped ready ones once each, over short and empty pages that lead on`, async () => {
        const queue = newQueue('list-behind');
        const [u] = await store.enqueue([job(queue, { u: 1 }, { delayMs: HOUR })]);
        // One group, so the delayed jobs lie behind every ready one in the group index.
        const ready = await store.enqueue(
          Array.from({ length: 2 * GROUP_SCAN_LIMIT + 100 }, (_, i) => job(queue, { i }, { groupKey: 'a' })),
        );
        const delayed = await store.enqueue(
          ['a', 'b', 'c'].map((groupKey) => job(queue, { groupKey }, { groupKey, delayMs: HOUR })),
        );
        const pages: JobListPage[] = [];
        let cursor: string | null = null;
        do {
          const page: JobListPage = await store.listJobs({ queue, state: 'delayed', limit: 2, cursor });
          pages.push(page);
          cursor = page.nextCursor;
        } while (cursor !== null && pages.length < 10);
        expect(pages.flatMap((page) => page.jobs.map((j) => j.id))).toEqual([u, ...delayed].map((r) => r!.jobId));
        // Each request reads GROUP_SCAN_LIMIT entries of the group index at most: the first finds
        // the ungrouped job only, the second none, the third the rest of the ready ones and two
        // delayed ones (a full page), the last the third.
        expect(pages.map((page) => page.jobs.length)).toEqual([1, 0, 2, 1]);
        expect(pages.map((page) => page.nextCursor === null)).toEqual([false, false, false, true]);
        expect(pages.every((page) => !page.scanLimited)).toBe(true);
        // The ready jobs of the same queue come in full pages: every entry read is listed.
        const listed = await listAll(queue, 'ready', 500);
        expect(listed.ids).toEqual(ready.map((r) => r.jobId).sort(byId));
        expect(listed.sizes).toEqual([...Array.from({ length: 8 }, () => 500), 100]);
      });

      it('lists leased jobs by lease end, then id', async () => {
        const queue = newQueue('list-leased');
        await store.enqueue(Array.from({ length: 6 }, (_, i) => job(queue, { i })));
        const lease = (limit: number, leaseMs: number) => store.claim({ queue, limit, leaseMs, workerId: WORKER });
        const late = await lease(1, 20 * 60_000);
        // One claim: the same lease end, so id order, and a page ends inside the tie.
        const early = await lease(3, 10 * 60_000);
        const latest = await lease(1, 30 * 60_000);
        const listed = await listAll(queue, 'leased', 2);
        expect(listed.ids).toEqual([...early.map((c) => c.id).sort(byId), late[0]!.id, latest[0]!.id]);
        expect(listed.sizes).toEqual([2, 2, 1]);
        expect(listed.jobs[0]).toMatchObject({ state: 'leased', workerId: WORKER, attempts: 1 });
        expect(listed.jobs[0]!.leaseUntil!.getTime()).toBe(early[0]!.leaseUntil.getTime());
        expect(listed.jobs[0]!.claimedAt).toBeInstanceOf(Date);
      });

      it('lists done jobs newest first (ties by id, descending), leaving out other queues', async () => {
        const queue = newQueue('list-done');
        const other = newQueue('list-done-other');
        await store.enqueue(Array.from({ length: 5 }, (_, i) => job(queue, { i })));
        await store.enqueue([job(other, {}), job(other, {})]);
        const completeNext = async (q: string, limit: number) => {
          const claimed = await store.claim({ queue: q, limit, leaseMs: 60_000, workerId: WORKER });
          await store.complete(claimed.map((c) => ({ id: c.id, claimToken: c.claimToken })));
          return claimed.map((c) => c.id);
        };
        const first = await completeNext(queue, 1);
        await completeNext(other, 1);
        // One statement: the same finish time, to the database's precision; a page ends inside it.
        const together = await completeNext(queue, 3);
        await completeNext(other, 1);
        const last = await completeNext(queue, 1);

        const listed = await listAll(queue, 'done', 2);
        expect(listed.ids).toEqual([...last, ...together.sort(byId).reverse(), ...first]);
        expect(listed.sizes).toEqual([2, 2, 1]);
        expect(listed.jobs.every((j) => j.state === 'done' && j.finishedAt instanceof Date)).toBe(true);
        const times = listed.jobs.map((j) => j.finishedAt!.getTime());
        expect(times).toEqual([...times].sort((a, b) => b - a));
      });

      it('lists dead jobs newest first, with the last error cut to its preview', async () => {
        const queue = newQueue('list-dead');
        await store.enqueue(Array.from({ length: 5 }, (_, i) => job(queue, { i }, { maxAttempts: 1 })));
        const claimed = await store.claim({ queue, limit: 5, leaseMs: 60_000, workerId: WORKER });
        const error = (id: string) => `${id}:${'é'.repeat(250)}`;
        await store.fail(claimed.map((c) => failure(c, error(c.id))));
        const listed = await listAll(queue, 'dead', 2);
        expect(listed.ids).toEqual(
          claimed
            .map((c) => c.id)
            .sort(byId)
            .reverse(),
        );
        expect(listed.sizes).toEqual([2, 2, 1]);
        for (const j of listed.jobs) {
          expect(j.lastErrorPreview).toBe(error(j.id).slice(0, JOB_PREVIEW_CHARS));
          expect(j.finishedAt).toBeInstanceOf(Date);
        }
      });

      // The JSON text is the database's: PostgreSQL's jsonb writes objects its own way (key order,
      // spaces), so the text is compared on payloads every dialect writes alike.
      it('previews are the first characters of the JSON text, whatever the payload size', async () => {
        const queue = newQueue('list-preview');
        const long = `é${'x'.repeat(JOB_PREVIEW_CHARS * 2)}`;
        const small = { to: 'a@example.com', tags: ['a', 'b'] };
        const [longJob, smallJob] = await store.enqueue([job(queue, long), job(queue, small)]);
        const blob = 'y'.repeat(900_000);
        const [big] = await store.enqueue([job(queue, blob)]);
        const page = await store.listJobs({ queue, state: 'ready', limit: 10 });
        const preview = (id: string) => page.jobs.find((j) => j.id === id)!;
        expect(preview(longJob!.jobId).payloadPreview).toBe(JSON.stringify(long).slice(0, JOB_PREVIEW_CHARS));
        expect(preview(longJob!.jobId).payloadPreview).toHaveLength(JOB_PREVIEW_CHARS);
        // A short payload comes whole: its preview is its JSON.
        expect(JSON.parse(preview(smallJob!.jobId).payloadPreview)).toEqual(small);
        expect(preview(big!.jobId).payloadPreview).toBe(`"${'y'.repeat(JOB_PREVIEW_CHARS - 1)}`);
        expect(preview(big!.jobId).lastErrorPreview).toBeNull();
        expect(page.jobs.every((j) => !('payload' in j) && !('claimToken' in j))).toBe(true);
      });

      it('refuses a malformed cursor, one of another listing, and a limit out of range, before any SQL', async () => {
        const queue = newQueue('list-cursor');
        await store.enqueue([job(queue, {}), job(queue, {})]);
        const { nextCursor } = await store.listJobs({ queue, state: 'ready', limit: 1 });
        expect(nextCursor).toEqual(expect.any(String));
        const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
        const tampered = JSON.parse(Buffer.from(nextCursor!, 'base64url').toString()) as Record<string, unknown>;
        const bad = [
          'not a cursor!',
          b64('x'),
          b64({ ...tampered, i: 'DROP TABLE' }),
          b64({ ...tampered, t: '2024-01-01 00:00' }),
          b64({ ...tampered, r: 1.5 }),
          // Times and keys the databases would refuse in the statement, which must not run.
          b64({ ...tampered, t: '2024-02-30T00:00:00.000Z' }),
          b64({ ...tampered, t: '0000-01-01T00:00:00.000Z' }),
          b64({ ...tampered, p: 'g', r: undefined, t: undefined, g: 'a\u0000' }),
          nextCursor!.slice(0, -4),
        ];
        for (const cursor of bad) {
          await expect(store.listJobs({ queue, state: 'ready', limit: 1, cursor })).rejects.toThrow(
            SqlQueueValidationError,
          );
        }
        // A cursor pages the listing it came from only.
        await expect(store.listJobs({ queue, state: 'delayed', limit: 1, cursor: nextCursor })).rejects.toThrow(
          /cursor for delayed jobs of queue .* is malformed.*belongs to the listing of 'ready' jobs/,
        );
        await expect(
          store.listJobs({ queue: newQueue('list-cursor-other'), state: 'ready', limit: 1, cursor: nextCursor }),
        ).rejects.toThrow(SqlQueueValidationError);
        for (const limit of [0, 501, 1.5]) {
          await expect(store.listJobs({ queue, state: 'ready', limit })).rejects.toThrow(SqlQueueValidationError);
        }
        expect((await store.listJobs({ queue, state: 'ready', limit: 1, cursor: nextCursor })).jobs).toHaveLength(1);
      });

      it('adds throughput counts up across calls, per queue, into the current minute', async () => {
        const queue = newQueue('tp-sum');
        const other = newQueue('tp-sum-other');
        await store.recordThroughput([{ queue, completed: 3, failed: 1, dead: 0 }]);
        await store.recordThroughput([
          { queue, completed: 2, failed: 0, dead: 1 },
          { queue: other, completed: 7, failed: 0, dead: 0 },
        ]);
        const reading = await store.readThroughput(5);
        expect(reading.now).toBeInstanceOf(Date);
        expect(Math.abs(reading.now.getTime() - Date.now())).toBeLessThan(60_000);
        const mine = reading.buckets.filter((b) => b.queue === queue);
        expect(mine.length).toBeGreaterThanOrEqual(1);
        expect(sum(mine)).toEqual({ completed: 5, failed: 1, dead: 1 });
        expect(sum(reading.buckets.filter((b) => b.queue === other))).toEqual({ completed: 7, failed: 0, dead: 0 });
        for (const bucket of reading.buckets) {
          expect(bucket.minute.getTime()).toBe(minuteOf(bucket.minute).getTime());
          expect(bucket.minute.getTime()).toBeLessThanOrEqual(reading.now.getTime());
        }
        const keys = reading.buckets.map((b) => [b.minute.getTime(), b.queue] as const);
        const sorted = [...keys].sort((a, b) => a[0] - b[0] || (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0));
        expect(keys).toEqual(sorted);
        // The last minute only: nothing older than the minute the database is in.
        const current = await store.readThroughput(1);
        for (const bucket of current.buckets) {
          expect(bucket.minute.getTime()).toBe(minuteOf(current.now).getTime());
        }
      });

      it('loses and doubles no count when many processes record at once', async () => {
        const queues = [newQueue('tp-race-a'), newQueue('tp-race-b')];
        const [one, two] = await openExtra(2);
        // Each call names both queues, in different orders: the same buckets, locked in one order.
        await Promise.all(
          Array.from({ length: 20 }, (_, i) =>
            (i % 2 === 0 ? one! : two!).recordThroughput(
              (i % 3 === 0 ? [...queues].reverse() : queues).map((queue) => ({
                queue,
                completed: i + 1,
                failed: 1,
                dead: i % 2,
              })),
            ),
          ),
        );
        const { buckets } = await store.readThroughput(10);
        for (const queue of queues) {
          expect(sum(buckets.filter((b) => b.queue === queue))).toEqual({ completed: 210, failed: 20, dead: 10 });
        }
      });

      it('sends nothing for no counts, and reads a window of 1 to 1440 minutes', async () => {
        const closed = await target.openStore(schema, { poolSize: 1 });
        await closed.close();
        // No statement: a closed store would fail one.
        await expect(closed.recordThroughput([])).resolves.toBeUndefined();
        await expect(
          closed.recordThroughput([{ queue: newQueue('tp-closed'), completed: 1, failed: 0, dead: 0 }]),
        ).rejects.toThrow();
        for (const minutes of [0, 1441, 1.5, Number.NaN]) {
          await expect(store.readThroughput(minutes)).rejects.toThrow(SqlQueueValidationError);
        }
        await expect(store.readThroughput(1440)).resolves.toMatchObject({ now: expect.any(Date) });
      });
    });

    describe('queue health: every queue in one statement, for scrapes', () => {
      const HOUR = 3_600_000;

      async function failOnce(queue: string, options: { dead?: boolean } = {}): Promise<ClaimedJob> {
        const claimed = await claimOne(queue, 600_000);
        const [result] = await store.fail([failure(claimed, 'boom', { dead: options.dead ?? false })]);
        expect(result!.outcome).toBe('ok');
        return claimed;
      }

      it('reports live figures, recent failures and repeatedly failing jobs, equal to stats()', async () => {
        const queue = newQueue('health');
        // One job fails three times and waits again: the job a queue length hides.
        const [stubborn] = await store.enqueue([job(queue, { stubborn: true }, { maxAttempts: 10 })]);
        for (let i = 0; i < 3; i++) expect((await failOnce(queue)).id).toBe(stubborn!.jobId);
        await store.enqueue([job(queue, { a: 1 }), job(queue, { a: 2 })]);
        await store.enqueue([job(queue, { later: true }, { delayMs: HOUR })]);
        // Dead at once (an unrecoverable error): one more recent failure.
        const [poison] = await store.enqueue([job(queue, { poison: true }, { priority: 9 })]);
        expect((await failOnce(queue, { dead: true })).id).toBe(poison!.jobId);
        // A lease that expires, is reaped (a recent lease expiry) and is claimed again.
        const [lost] = await store.enqueue([job(queue, { lost: true }, { priority: 8 })]);
        const first = await claimOne(queue, 1);
        expect(first.id).toBe(lost!.jobId);
        await reapUntil(queue, first.id);
        const again = await claimOne(queue, 600_000);
        expect(again.id).toBe(lost!.jobId);

        const all = await store.queueHealth({ failureWindowMs: HOUR, repeatedFailures: 3 });
        const health = all.find((q) => q.queue === queue);
        expect(health).toEqual({
          queue,
          ready: 3,
          delayed: 1,
          leased: 1,
          expiredLeases: 0,
          dead: 1,
          retrying: 1,
          blockedGroups: 0,
          repeatedlyFailing: 1,
          recentFailures: 4,
          recentLeaseExpiries: 1,
          oldestReadyAgeMs: expect.any(Number),
          paused: false,
        });
        const stats = await store.stats(queue);
        const { recentFailures, recentLeaseExpiries, repeatedlyFailing, ...live } = health!;
        expect({ ...live, oldestReadyAgeMs: 0 }).toEqual({ ...stats, oldestReadyAgeMs: 0 });
        expect([recentFailures, recentLeaseExpiries, repeatedlyFailing]).toEqual([4, 1, 1]);
        expect(Math.abs(live.oldestReadyAgeMs - stats.oldestReadyAgeMs)).toBeLessThan(5_000);
        // A higher threshold: the job that failed three times is not "repeatedly failing" at 4.
        const stricter = await store.queueHealth({ failureWindowMs: HOUR, repeatedFailures: 4 });
        expect(stricter.find((q) => q.queue === queue)?.repeatedlyFailing).toBe(0);
        // Queues come back in name order, each once.
        const names = all.map((q) => q.queue);
        expect(names).toEqual([...new Set(names)].sort());
      });

      it('counts a leased job as repeatedly failing by the failures before its current attempt', async () => {
        const queue = newQueue('healthleased');
        await store.enqueue([job(queue, {}, { maxAttempts: 10 })]);
        for (let i = 0; i < 2; i++) await failOnce(queue);
        await claimOne(queue, 600_000); // third attempt running: two failures so far
        const read = async (repeatedFailures: number) =>
          (await store.queueHealth({ failureWindowMs: HOUR, repeatedFailures })).find((q) => q.queue === queue);
        expect(await read(2)).toMatchObject({ leased: 1, repeatedlyFailing: 1, recentFailures: 2 });
        expect(await read(3)).toMatchObject({ leased: 1, repeatedlyFailing: 0 });
      });

      it('leaves out a queue with only finished jobs and no failures in the window', async () => {
        const queue = newQueue('healthdone');
        await store.enqueue([job(queue, { n: 1 }), job(queue, { n: 2 })]);
        await failOnce(queue);
        const claimed = await store.claim({ queue, limit: 2, leaseMs: 60_000, workerId: WORKER });
        expect(claimed).toHaveLength(2);
        await store.complete(claimed.map((c) => ({ id: c.id, claimToken: c.claimToken })));
        const withFailure = await store.queueHealth({ failureWindowMs: HOUR, repeatedFailures: 3 });
        expect(withFailure.find((q) => q.queue === queue)).toMatchObject({ ready: 0, leased: 0, recentFailures: 1 });
        // Once the failure is older than the window, nothing is left to report for the queue.
        await waitFor(
          async () =>
            (await store.queueHealth({ failureWindowMs: 1, repeatedFailures: 3 })).some((q) => q.queue === queue),
          (present) => !present,
          { what: `queue ${queue} to drop out of queueHealth` },
        );
      });
    });

    describe('ordered groups', () => {
      const HOUR = 3_600_000;

      function units(queue: string, limit: number, groupBatchSize = 1, leaseMs = 60_000): Promise<ClaimedJob[]> {
        return store.claim({ queue, limit, groupBatchSize, leaseMs, workerId: WORKER });
      }

      async function enqueueIds(jobs: NewJob[], transaction?: unknown): Promise<string[]> {
        return (await store.enqueue(jobs, transaction)).map((r) => r.jobId);
      }

      const idsOf = (jobs: readonly { id: string }[]) => jobs.map((j) => j.id);
      const owned = (jobs: readonly ClaimedJob[]) => jobs.map(({ id, claimToken }) => ({ id, claimToken }));
      const sortIds = (ids: readonly string[]) => [...ids].sort((a, b) => Number(BigInt(a) - BigInt(b)));
      const grouped = (queue: string, groupKey: string, payload: unknown = {}, options: EnqueueOptions = {}) =>
        job(queue, payload, { ...options, groupKey });

      /** The cached group state of the queue agrees with its jobs: the repair sweep finds nothing. */
      async function expectNothingToRepair(queue: string): Promise<void> {
        // Twice: a sweep resumes where the last one stopped, and may start mid-way.
        const repairs = [...(await store.repairGroups(10_000)), ...(await store.repairGroups(10_000))];
        expect(repairs.filter((r) => r.queue === queue)).toEqual([]);
      }

      it('runs one group in id order, one job at a time: a claim returns only the head, the next after completion', async () => {
        const queue = newQueue('grp-order');
        // Every enqueue path: one job, a uniform bulk (one group, no keys), a mixed bulk.
        const expected = [
          ...(await enqueueIds([grouped(queue, 'g', { n: 1 })])),
          ...(await enqueueIds([grouped(queue, 'g', { n: 2 }), grouped(queue, 'g', { n: 3 })])),
          ...(await enqueueIds([
            grouped(queue, 'g', { n: 4 }, { idempotencyKey: 'g-4' }),
            // A later job of higher priority does not overtake the ones before it in its group.
            grouped(queue, 'g', { n: 5 }, { priority: 9 }),
          ])),
        ];
        for (const id of expected) {
          const claimed = await units(queue, 10);
          expect(idsOf(claimed)).toEqual([id]);
          expect(claimed[0]!.groupKey).toBe('g');
          // Held: nothing more of the group, however many units are asked for.
          expect(await units(queue, 10, 5)).toEqual([]);
          expect(await store.hasClaimableWork(queue)).toBe(false);
          expect(await store.complete(owned(claimed))).toEqual([{ id, outcome: 'ok' }]);
        }
        expect(await units(queue, 10)).toEqual([]);
        expect(await store.stats(queue)).toMatchObject({ ready: 0, delayed: 0, leased: 0, blockedGroups: 0 });
        await expectNothingToRepair(queue);
      });

      it('claims the heads of different groups together; ungrouped jobs in the queue are claimed as before', async () => {
        const queue = newQueue('grp-many');
        const [a1, b1, a2, u1, b2, c1, u2] = await enqueueIds([
          grouped(queue, 'a', { k: 'a1' }),
          grouped(queue, 'b', { k: 'b1' }),
          grouped(queue, 'a', { k: 'a2' }),
          job(queue, { k: 'u1' }),
          grouped(queue, 'b', { k: 'b2' }),
          grouped(queue, 'c', { k: 'c1' }),
          job(queue, { k: 'u2' }),
        ]);
        const first = await units(queue, 10);
        expect(sortIds(idsOf(first))).toEqual(sortIds([a1!, b1!, c1!, u1!, u2!]));
        expect(new Set(first.map((c) => c.claimToken)).size).toBe(5);
        // Ungrouped jobs hold no group: another one is claimable at once, several at a time.
        const [u3, u4] = await enqueueIds([job(queue, { k: 'u3' }), job(queue, { k: 'u4' })]);
        expect(sortIds(idsOf(await units(queue, 10)))).toEqual([u3, u4]);
        // Completing a's head frees a (only a).
        await store.complete(owned(first.filter((c) => c.id === a1)));
        const second = await units(queue, 10);
        expect(idsOf(second)).toEqual([a2]);
        await store.complete(owned(first.filter((c) => c.id === b1)));
        expect(idsOf(await units(queue, 10))).toEqual([b2]);
        await expectNothingToRepair(queue);
      });

      it('a group whose first job is not due yet waits for it: the ready job behind it does not overtake', async () => {
        const queue = newQueue('grp-delayed');
        const [d1] = await enqueueIds([grouped(queue, 'g', { n: 1 }, { delayMs: 300 })]);
        const [d2] = await enqueueIds([grouped(queue, 'g', { n: 2 })]);
        const claimed = await waitFor(
          () => units(queue, 10),
          (c) => c.length > 0,
          { what: 'the delayed head of the group' },
        );
        expect(idsOf(claimed)).toEqual([d1]);
        expect(claimed[0]!.claimedAt.getTime()).toBeGreaterThanOrEqual((await store.getJob(d1!))!.runAt.getTime());
        await store.complete(owned(claimed));
        expect(idsOf(await units(queue, 10))).toEqual([d2]);
        await expectNothingToRepair(queue);
      });

      it('claims the heads of groups in priority order', async () => {
        const queue = newQueue('grp-prio');
        const [low] = await enqueueIds([grouped(queue, 'low', {}, { priority: -1 })]);
        const [normal] = await enqueueIds([grouped(queue, 'normal', {})]);
        const [high] = await enqueueIds([grouped(queue, 'high', {}, { priority: 7 })]);
        const order: string[] = [];
        for (let i = 0; i < 3; i++) order.push(...idsOf(await units(queue, 1)));
        expect(order).toEqual([high, normal, low]);
      });

      it('a job waiting for its retry keeps its place: the next job of the group waits until it completes', async () => {
        const queue = newQueue('grp-retry');
        const [j1, j2] = await enqueueIds([
          grouped(queue, 'g', { n: 1 }, { maxAttempts: 5 }),
          grouped(queue, 'g', { n: 2 }),
        ]);
        const first = await units(queue, 10);
        expect(idsOf(first)).toEqual([j1]);
        // Retried at once: the same job comes back, not the next one.
        expect(await store.fail([failure(first[0]!, 'again')])).toEqual([{ id: j1, outcome: 'ok', state: 'ready' }]);
        const second = await units(queue, 10);
        expect(second.map((c) => [c.id, c.attempt])).toEqual([[j1, 2]]);
        // Retried after a backoff: it waits as delayed, and still holds the group's place.
        expect(await store.fail([failure(second[0]!, 'later', { retryDelayMs: 400 })])).toEqual([
          { id: j1, outcome: 'ok', state: 'delayed' },
        ]);
        expect(await store.stats(queue)).toMatchObject({ leased: 0, retrying: 1 });
        const third = await waitFor(
          async () => {
            const claimed = await units(queue, 10);
            // Every claim before the retry is due comes back empty: j2 never overtakes it.
            expect(idsOf(claimed)).not.toContain(j2);
            return claimed;
          },
          (c) => c.length > 0,
          { what: 'the retry after its backoff' },
        );
        expect(third.map((c) => [c.id, c.attempt])).toEqual([[j1, 3]]);
        expect(await units(queue, 10)).toEqual([]);
        await store.complete(owned(third));
        expect(idsOf(await units(queue, 10))).toEqual([j2]);
        await expectNothingToRepair(queue);
      });

      it('release gives the head back: it comes next, its attempt not counted; a heartbeat leaves the group as it is', async () => {
        const queue = newQueue('grp-release');
        const [j1, j2] = await enqueueIds([grouped(queue, 'g', { n: 1 }), grouped(queue, 'g', { n: 2 })]);
        const first = await units(queue, 10);
        const [beat] = await store.heartbeat([
          { id: j1!, claimToken: first[0]!.claimToken, leaseMs: 60_000, maxDurationMs: null },
        ]);
        expect(beat!.outcome).toBe('ok');
        expect(await units(queue, 10)).toEqual([]);
        expect(await store.release(owned(first))).toEqual([{ id: j1, outcome: 'ok' }]);
        const again = await units(queue, 10);
        expect(again.map((c) => [c.id, c.attempt])).toEqual([[j1, 1]]);
        await store.complete(owned(again));
        expect(idsOf(await units(queue, 10))).toEqual([j2]);
      });

      it("an expired lease is reaped back to the group's head: the same job comes next, and the stale token is refused", async () => {
        const queue = newQueue('grp-reap');
        const [j1, j2] = await enqueueIds([grouped(queue, 'g', { n: 1 }), grouped(queue, 'g', { n: 2 })]);
        const [stale] = await units(queue, 10, 1, 1);
        expect(stale!.id).toBe(j1);
        await reapUntil(queue, j1!);
        const again = await units(queue, 10);
        expect(again.map((c) => [c.id, c.attempt])).toEqual([[j1, 2]]);
        const old = { id: j1!, claimToken: stale!.claimToken };
        expect(await store.complete([old])).toEqual([{ id: j1, outcome: 'lost' }]);
        expect(await store.fail([failure(old, 'stale')])).toEqual([{ id: j1, outcome: 'lost', state: null }]);
        expect(await store.release([old])).toEqual([{ id: j1, outcome: 'lost' }]);
        expect(await store.heartbeat([{ ...old, leaseMs: 60_000, maxDurationMs: null }])).toEqual([
          { id: j1, outcome: 'lost', leaseUntil: null },
        ]);
        // The stale writes moved nothing: the group is still held by the new owner.
        expect(await units(queue, 10)).toEqual([]);
        expect(await store.complete(owned(again))).toEqual([{ id: j1, outcome: 'ok' }]);
        expect(idsOf(await units(queue, 10))).toEqual([j2]);
        await expectNothingToRepair(queue);
      });

      it('the reaper returns a whole group batch whose lease expired; the batch comes back in order', async () => {
        const queue = newQueue('grp-reapbatch');
        const ids = await enqueueIds([1, 2, 3].map((n) => grouped(queue, 'g', { n })));
        const batch = await units(queue, 1, 2, 1);
        expect(idsOf(batch)).toEqual(ids.slice(0, 2));
        await reapUntil(queue, ids[0]!);
        await waitFor(
          () => store.getJob(ids[1]!),
          (record) => record?.state === 'ready',
          { what: 'the second job of the expired batch to be returned too' },
        );
        const again = await units(queue, 10, 3);
        expect(idsOf(again)).toEqual(ids);
        // Only the batch's first job can have started: the second got its attempt back.
        expect(again.map((c) => c.attempt)).toEqual([2, 1, 1]);
        expect((await store.getAttempts(ids[1]!)).map((a) => a.outcome)).toEqual([]);
        expect(new Set(again.map((c) => c.claimToken)).size).toBe(1);
        expect(again[0]!.claimToken).not.toBe(batch[0]!.claimToken);
        expect(await store.complete(owned(batch))).toEqual(batch.map((c) => ({ id: c.id, outcome: 'lost' })));
      });

      it("groupOnDead 'continue' (the default): the next job runs after one dies, by failure or lease expiry", async () => {
        const queue = newQueue('grp-continue');
        const [j1, j2, j3, j4] = await enqueueIds([
          grouped(queue, 'g', { n: 1 }, { maxAttempts: 1 }),
          grouped(queue, 'g', { n: 2 }),
          grouped(queue, 'g', { n: 3 }, { maxAttempts: 1 }),
          grouped(queue, 'g', { n: 4 }),
        ]);
        const first = await units(queue, 10);
        expect(await store.fail([failure(first[0]!, 'boom')])).toEqual([{ id: j1, outcome: 'ok', state: 'dead' }]);
        const second = await units(queue, 10);
        expect(idsOf(second)).toEqual([j2]);
        await store.complete(owned(second));
        // Recorded explicitly now, and the death comes from the reaper.
        await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'continue' }]);
        const third = await units(queue, 10, 1, 1);
        expect(idsOf(third)).toEqual([j3]);
        await reapUntil(queue, j3!);
        expect((await store.getJob(j3!))!.state).toBe('dead');
        expect(idsOf(await units(queue, 10))).toEqual([j4]);
        expect(await store.stats(queue)).toMatchObject({ dead: 2, blockedGroups: 0 });
        expect(await store.listBlockedGroups(queue, { limit: 10 })).toEqual({ groups: [], nextAfterKey: null });
        await expectNothingToRepair(queue);
      });

      it("groupOnDead 'block': a dead job stops its group (counted, listed with its id) until retried; the retried job runs first", async () => {
        const queue = newQueue('grp-block');
        await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'block' }]);
        const [a1, a2, b1, b2] = await enqueueIds([
          grouped(queue, 'a', { k: 'a1' }, { maxAttempts: 1 }),
          grouped(queue, 'a', { k: 'a2' }),
          grouped(queue, 'b', { k: 'b1' }),
          grouped(queue, 'b', { k: 'b2' }),
        ]);
        const heads = await units(queue, 10);
        expect(sortIds(idsOf(heads))).toEqual([a1, b1]);
        expect(
          await store.fail([
            failure(
              heads.find((h) => h.id === a1)!,
              'poison',
            ),
          ]),
        ).toEqual([{ id: a1, outcome: 'ok', state: 'dead' }]);
        await store.complete(owned(heads.filter((h) => h.id === b1)));
        // b goes on; a is stopped: a2 is never claimed.
        const next = await units(queue, 10);
        expect(idsOf(next)).toEqual([b2]);
        await store.complete(owned(next));
        expect(await units(queue, 10)).toEqual([]);
        expect(await store.hasClaimableWork(queue)).toBe(false);
        expect(await store.stats(queue)).toMatchObject({ ready: 1, dead: 1, blockedGroups: 1 });
        const health = (await store.queueHealth({ failureWindowMs: HOUR, repeatedFailures: 3 })).find(
          (q) => q.queue === queue,
        );
        expect(health?.blockedGroups).toBe(1);
        const page = await store.listBlockedGroups(queue, { limit: 10 });
        expect(page).toEqual({
          groups: [{ groupKey: 'a', jobId: a1, error: 'poison', diedAt: expect.any(Date) }],
          nextAfterKey: null,
        });
        expect(page.groups[0]!.diedAt!.getTime()).toBe((await store.getJob(a1!))!.finishedAt!.getTime());
        await expectNothingToRepair(queue);

        // Retrying the dead job releases the group, and it runs before the job behind it.
        expect(await store.retryDead(queue, [a1!])).toEqual([a1]);
        expect((await store.stats(queue)).blockedGroups).toBe(0);
        expect(await store.listBlockedGroups(queue, { limit: 10 })).toEqual({ groups: [], nextAfterKey: null });
        const retried = await units(queue, 10);
        expect(retried.map((c) => [c.id, c.attempt])).toEqual([[a1, 1]]);
        await store.complete(owned(retried));
        expect(idsOf(await units(queue, 10))).toEqual([a2]);
        await expectNothingToRepair(queue);
      });

      it("groupOnDead 'block': retrying an older dead job together with the blocking one releases the group, the older first", async () => {
        const queue = newQueue('grp-block-older');
        // j1 dies while the queue continues past dead jobs; j2 dies once it blocks.
        await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'continue' }]);
        const [j1, j2, j3] = await enqueueIds([
          grouped(queue, 'g', { n: 1 }, { maxAttempts: 1 }),
          grouped(queue, 'g', { n: 2 }, { maxAttempts: 1 }),
          grouped(queue, 'g', { n: 3 }),
        ]);
        const first = await units(queue, 10);
        expect(await store.fail([failure(first[0]!, 'old poison')])).toEqual([
          { id: j1, outcome: 'ok', state: 'dead' },
        ]);
        await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'block' }]);
        const second = await units(queue, 10);
        expect(idsOf(second)).toEqual([j2]);
        await store.fail([failure(second[0]!, 'poison')]);
        expect((await store.listBlockedGroups(queue, { limit: 10 })).groups.map((g) => g.jobId)).toEqual([j2]);
        expect(sortIds(await store.retryDead(queue, [j1!, j2!]))).toEqual([j1, j2]);
        expect((await store.stats(queue)).blockedGroups).toBe(0);
        for (const expected of [j1, j2, j3]) {
          const next = await units(queue, 10);
          expect(idsOf(next)).toEqual([expected]);
          await store.complete(owned(next));
        }
        await expectNothingToRepair(queue);
      });

      it("groupOnDead 'block': blocked groups page by key; a death by lease expiry blocks too; purging the dead jobs releases them", async () => {
        const queue = newQueue('grp-purge');
        await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'block' }]);
        // c dies through the reaper; b and a through failures (given out of key order).
        const [c1, c2] = await enqueueIds([grouped(queue, 'c', {}, { maxAttempts: 1 }), grouped(queue, 'c', {})]);
        expect(idsOf(await units(queue, 10, 1, 1))).toEqual([c1]);
        await reapUntil(queue, c1!);
        const [b1, b2, a1, a2] = await enqueueIds([
          grouped(queue, 'b', {}, { maxAttempts: 1 }),
          grouped(queue, 'b', {}),
          grouped(queue, 'a', {}, { maxAttempts: 1 }),
          grouped(queue, 'a', {}),
        ]);
        const heads = await units(queue, 10);
        expect(sortIds(idsOf(heads))).toEqual([b1, a1]);
        await store.fail(heads.map((h) => failure(h, `dies ${h.id}`)));
        expect(await units(queue, 10)).toEqual([]);
        expect((await store.stats(queue)).blockedGroups).toBe(3);

        const page1 = await store.listBlockedGroups(queue, { limit: 2 });
        expect(page1.groups.map((g) => [g.groupKey, g.jobId])).toEqual([
          ['a', a1],
          ['b', b1],
        ]);
        expect(page1.nextAfterKey).toBe('b');
        const page2 = await store.listBlockedGroups(queue, { limit: 2, afterKey: page1.nextAfterKey });
        expect(page2.groups.map((g) => [g.groupKey, g.jobId])).toEqual([['c', c1]]);
        expect(page2.groups[0]!.error).toMatch(/lease expired/);
        expect(page2.nextAfterKey).toBeNull();

        expect(await store.purgeDead(queue)).toBe(3);
        expect((await store.stats(queue)).blockedGroups).toBe(0);
        expect(await store.listBlockedGroups(queue, { limit: 10 })).toEqual({ groups: [], nextAfterKey: null });
        expect(sortIds(idsOf(await units(queue, 10)))).toEqual(sortIds([c2!, b2!, a2!]));
        await expectNothingToRepair(queue);
      });

      it('a group batch leases the head and the following due jobs under one token, in id order; a job not due yet ends it', async () => {
        const queue = newQueue('grp-batch');
        const [r1, r2, d3] = await enqueueIds([
          grouped(queue, 'g', { n: 1 }, { maxAttempts: 5 }),
          grouped(queue, 'g', { n: 2 }),
          grouped(queue, 'g', { n: 3 }, { delayMs: HOUR }),
        ]);
        await enqueueIds([grouped(queue, 'g', { n: 4 })]);
        const batch = await units(queue, 1, 3);
        expect(idsOf(batch)).toEqual([r1, r2]);
        expect(new Set(batch.map((c) => c.claimToken)).size).toBe(1);
        expect(await units(queue, 10, 3)).toEqual([]);
        // A failure of the first gives the second back: ready again, its attempt not counted.
        expect(await store.fail([failure(batch[0]!, 'first failed')])).toEqual([
          { id: r1, outcome: 'ok', state: 'ready' },
        ]);
        expect(await store.getJob(r2!)).toMatchObject({ state: 'ready', attempts: 0, claimToken: null });
        expect(await store.complete(owned(batch.slice(1)))).toEqual([{ id: r2, outcome: 'lost' }]);
        const again = await units(queue, 1, 3);
        expect(again.map((c) => [c.id, c.attempt])).toEqual([
          [r1, 2],
          [r2, 1],
        ]);
        // The first done, the group stays held for the second (same token).
        expect(await store.complete(owned(again.slice(0, 1)))).toEqual([{ id: r1, outcome: 'ok' }]);
        expect(await units(queue, 10, 3)).toEqual([]);
        expect(await store.complete(owned(again.slice(1)))).toEqual([{ id: r2, outcome: 'ok' }]);
        // The job not due yet is the head now: the ready job behind it does not overtake it.
        expect(await units(queue, 10, 3)).toEqual([]);
        expect((await store.getJob(d3!))!.state).toBe('delayed');
        await expectNothingToRepair(queue);
      });

      it('`limit` counts units: a group batch is one unit, an ungrouped job is one', async () => {
        const queue = newQueue('grp-units');
        const byGroup = new Map<string | null, string[]>();
        for (const key of ['g1', 'g2', 'g3']) {
          byGroup.set(key, await enqueueIds([1, 2, 3].map((n) => grouped(queue, key, { n }))));
        }
        byGroup.set(null, await enqueueIds([job(queue, { u: 1 }), job(queue, { u: 2 })]));
        /** The claim as units: runs of one token, each one group's consecutive jobs or one ungrouped job. */
        const unitsOf = (claimed: ClaimedJob[]) => {
          const runs: ClaimedJob[][] = [];
          for (const c of claimed) {
            const last = runs[runs.length - 1];
            if (last && last[0]!.claimToken === c.claimToken) last.push(c);
            else runs.push([c]);
          }
          expect(new Set(runs.map((r) => r[0]!.claimToken)).size).toBe(runs.length);
          for (const run of runs) {
            const key = run[0]!.groupKey;
            expect(run.every((c) => c.groupKey === key)).toBe(true);
            if (key === null) expect(run).toHaveLength(1);
            else expect(idsOf(run)).toEqual(byGroup.get(key));
          }
          return runs;
        };
        const first = unitsOf(await units(queue, 2, 3));
        expect(first).toHaveLength(2);
        const rest = unitsOf(await units(queue, 10, 3));
        expect(rest).toHaveLength(3);
        const all = [...first, ...rest].flat();
        expect(sortIds(idsOf(all))).toEqual(sortIds([...byGroup.values()].flat()));
      });

      it('a rolled-back enqueue leaves no job and no group state: the next job of the group still runs', async () => {
        const queue = newQueue('grp-tx');
        // Into a group that has no state yet.
        const fresh = await target.beginTransaction();
        const [gone] = await enqueueIds([grouped(queue, 'g', { n: 0 })], fresh.handle);
        await fresh.rollback();
        expect(await store.getJob(gone!)).toBeNull();
        expect(await units(queue, 10)).toEqual([]);
        expect(await store.hasClaimableWork(queue)).toBe(false);

        // Into a group whose head is leased, and completes while the transaction is open.
        const [j1] = await enqueueIds([grouped(queue, 'g', { n: 1 })]);
        const head = await units(queue, 10);
        expect(idsOf(head)).toEqual([j1]);
        const open = await target.beginTransaction();
        const rolledBack = await enqueueIds(
          [grouped(queue, 'g', { n: 2 }), grouped(queue, 'g', { n: 3 }, { idempotencyKey: 'tx-3' })],
          open.handle,
        );
        if (target.concurrentSessions) expect(await store.complete(owned(head))).toEqual([{ id: j1, outcome: 'ok' }]);
        await open.rollback();
        if (!target.concurrentSessions) await store.complete(owned(head));
        for (const id of rolledBack) expect(await store.getJob(id)).toBeNull();

        const [j4] = await enqueueIds([grouped(queue, 'g', { n: 4 })]);
        const next = await waitFor(
          () => units(queue, 10),
          (c) => c.length > 0,
          { what: "the group's next job after the rollback" },
        );
        expect(idsOf(next)).toEqual([j4]);

        // A committed one joins the group behind the leased head as usual.
        const committed = await target.beginTransaction();
        const [j5] = await enqueueIds([grouped(queue, 'g', { n: 5 })], committed.handle);
        await committed.commit();
        expect(await units(queue, 10)).toEqual([]);
        await store.complete(owned(next));
        expect(idsOf(await units(queue, 10))).toEqual([j5]);
        await expectNothingToRepair(queue);
      });

      it("an idempotent repeat of a group's finished job changes nothing in the group", async () => {
        const queue = newQueue('grp-idem');
        const [j1] = await enqueueIds([grouped(queue, 'g', { n: 1 }, { idempotencyKey: 'once' })]);
        const claimed = await units(queue, 10);
        await store.complete(owned(claimed));
        expect(await store.enqueue([grouped(queue, 'g', { n: 1 }, { idempotencyKey: 'once' })])).toEqual([
          { jobId: j1, created: false },
        ]);
        expect(await units(queue, 10)).toEqual([]);
        const [j2] = await enqueueIds([grouped(queue, 'g', { n: 2 })]);
        // And a repeat of a waiting job (in a bulk with a new one) leaves its place as it was.
        const repeated = await store.enqueue([
          grouped(queue, 'g', { n: 1 }, { idempotencyKey: 'once' }),
          grouped(queue, 'g', { n: 3 }, { idempotencyKey: 'new' }),
        ]);
        expect(repeated[0]).toEqual({ jobId: j1, created: false });
        expect(idsOf(await units(queue, 10))).toEqual([j2]);
        await expectNothingToRepair(queue);
      });

      it('retention cleanup never deletes the dead job that blocks its group', async () => {
        const queue = newQueue('grp-retain');
        const other = newQueue('grp-retain-continue');
        await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'block' }]);
        const [blocker, behind, loose] = await enqueueIds([
          grouped(queue, 'g', { k: 'blocker' }, { maxAttempts: 1 }),
          grouped(queue, 'g', { k: 'behind' }),
          job(queue, { k: 'loose' }, { maxAttempts: 1 }),
        ]);
        // Under 'continue' a dead job of a group blocks nothing, and retention takes it.
        const [passed] = await enqueueIds([grouped(other, 'g', {}, { maxAttempts: 1 })]);
        const claimed = [...(await units(queue, 10)), ...(await units(other, 10))];
        expect(sortIds(idsOf(claimed))).toEqual(sortIds([blocker!, loose!, passed!]));
        await store.fail(claimed.map((c) => failure(c, 'dies', { dead: true })));
        const dropAll = { doneRetentionMs: 1, deadRetentionMs: 1, idempotencyRetentionMs: 1, batchSize: 1000 };
        await waitFor(
          async () => {
            await store.cleanup(dropAll);
            return Promise.all([store.getJob(loose!), store.getJob(passed!)]);
          },
          (records) => records.every((r) => r === null),
          { what: 'the dead jobs that block nothing to pass their retention' },
        );
        expect(await store.getJob(blocker!)).toMatchObject({ state: 'dead' });
        expect((await store.stats(queue)).blockedGroups).toBe(1);
        expect(await units(queue, 10)).toEqual([]);
        expect(await store.retryDead(queue, [blocker!])).toEqual([blocker]);
        const retried = await units(queue, 10);
        expect(idsOf(retried)).toEqual([blocker]);
        await store.complete(owned(retried));
        expect(idsOf(await units(queue, 10))).toEqual([behind]);
        await expectNothingToRepair(queue);
      });
    });

    describe('recurring jobs (schedules)', () => {
      const HOUR = 3_600_000;
      /** The store under its schedule port (until QueueStore extends ScheduleStore). */
      const schedules = (on: QueueStore = store) => on as QueueStore & ScheduleStore;
      let scheduleSeq = 0;
      const newScheduleId = (label: string) => `${label}.${++scheduleSeq}`;

      /** The database's clock: schedule times are set relative to it, never to this process's. */
      const dbNow = async () => (await schedules().scheduleDueIn()).now;

      function upsert(id: string, fields: Partial<ScheduleUpsert> & { queue: string }): ScheduleUpsert {
        return {
          id,
          cron: '0 * * * *',
          timezone: 'UTC',
          payload: '{"n":1}',
          options: '{}',
          catchUp: 'last',
          source: 'api',
          nextRunAt: null,
          ...fields,
        };
      }

      const fireNext = fireNextHour;

      beforeEach(async () => {
        // fireDueSchedules reads every queue's schedules: each test starts with none.
        for (const row of await schedules().listSchedules()) await schedules().deleteSchedule(row.id);
      });

      it('upsert inserts, then updates by id: an unchanged timing keeps next_run_at, a changed cron or time zone takes the new one', async () => {
        const id = newScheduleId('report.daily');
        const queue = newQueue('sched-upsert');
        const now = await dbNow();
        const first = later(now, HOUR);
        await schedules().upsertSchedules([upsert(id, { queue, nextRunAt: first, source: 'options' })]);
        const inserted = await schedules().getSchedule(id);
        expect(inserted).toMatchObject({
          id,
          queue,
          cron: '0 * * * *',
          timezone: 'UTC',
          payload: '{"n":1}',
          options: '{}',
          catchUp: 'last',
          paused: false,
          source: 'options',
          lastRunAt: null,
          lastTick: null,
        });
        expect(inserted!.nextRunAt!.getTime()).toBe(first.getTime());
        expect(inserted!.createdAt).toBeInstanceOf(Date);
        expect(inserted!.updatedAt).toBeInstanceOf(Date);

        // Same timing: everything else is updated, next_run_at is kept (the given one ignored).
        const queue2 = newQueue('sched-upsert-moved');
        await schedules().upsertSchedules([
          upsert(id, {
            queue: queue2,
            payload: '{"n":2}',
            options: '{"priority":5}',
            catchUp: 'all',
            source: 'api',
            nextRunAt: later(now, 2 * HOUR),
          }),
        ]);
        const updated = await schedules().getSchedule(id);
        expect(updated).toMatchObject({
          queue: queue2,
          payload: '{"n":2}',
          options: '{"priority":5}',
          catchUp: 'all',
          source: 'api',
        });
        expect(updated!.nextRunAt!.getTime()).toBe(first.getTime());
        expect(updated!.createdAt.getTime()).toBe(inserted!.createdAt.getTime());

        // A changed cron takes the new next_run_at; so does a changed time zone.
        const second = later(now, 3 * HOUR);
        await schedules().upsertSchedules([upsert(id, { queue: queue2, cron: '30 * * * *', nextRunAt: second })]);
        expect(await schedules().getSchedule(id)).toMatchObject({ cron: '30 * * * *', nextRunAt: second });
        const third = later(now, 4 * HOUR);
        await schedules().upsertSchedules([
          upsert(id, { queue: queue2, cron: '30 * * * *', timezone: 'Europe/Stockholm', nextRunAt: third }),
        ]);
        expect(await schedules().getSchedule(id)).toMatchObject({ timezone: 'Europe/Stockholm', nextRunAt: third });
        // An expression with no later tick has no next run.
        await schedules().upsertSchedules([upsert(id, { queue: queue2, cron: '0 0 30 2 *', nextRunAt: null })]);
        expect(await schedules().getSchedule(id)).toMatchObject({ cron: '0 0 30 2 *', nextRunAt: null });

        // A paused schedule stays paused through an upsert, even one that changes its timing.
        expect(await schedules().setSchedulePaused(id, true, null)).toBe(true);
        await schedules().upsertSchedules([upsert(id, { queue: queue2, cron: '15 * * * *', nextRunAt: first })]);
        expect(await schedules().getSchedule(id)).toMatchObject({ paused: true, cron: '15 * * * *' });
      });

      it('prunes the schedules of the given source that the list leaves out, never those of the other source', async () => {
        const queue = newQueue('sched-prune');
        const [a, b, c] = [newScheduleId('prune-a'), newScheduleId('prune-b'), newScheduleId('prune-c')];
        await schedules().upsertSchedules([
          upsert(a, { queue, source: 'options' }),
          upsert(b, { queue, source: 'options' }),
          upsert(c, { queue, source: 'api' }),
        ]);
        await schedules().upsertSchedules([upsert(a, { queue, source: 'options' })], 'options');
        expect((await schedules().listSchedules()).map((row) => row.id).sort()).toEqual([a, c].sort());
        await schedules().upsertSchedules([], 'options');
        expect((await schedules().listSchedules()).map((row) => row.id)).toEqual([c]);
      });

      it('processes upserting the same schedules at once, in crossing orders, leave one row per id', async () => {
        const queue = newQueue('sched-race');
        const [x, y] = [newScheduleId('race-x'), newScheduleId('race-y')];
        const processes = await openExtra(4);
        const next = later(await dbNow(), HOUR);
        for (let round = 0; round < 5; round++) {
          await Promise.all(
            processes.map((p, i) => {
              const items = [upsert(x, { queue, nextRunAt: next }), upsert(y, { queue, nextRunAt: next })];
              return schedules(p).upsertSchedules(i % 2 === 0 ? items : items.reverse(), 'api');
            }),
          );
        }
        const rows = await schedules().listSchedules();
        expect(rows.map((row) => row.id).sort()).toEqual([x, y].sort());
      });

      it('scheduleDueIn: null with no schedule to run, > 0 before the earliest is due, <= 0 once it is', async () => {
        const queue = newQueue('sched-duein');
        const none = await schedules().scheduleDueIn();
        expect(none.now).toBeInstanceOf(Date);
        expect(none.dueInMs).toBeNull();

        const now = await dbNow();
        // Paused, or with no later tick: never due.
        const [paused, ended] = [newScheduleId('duein-paused'), newScheduleId('duein-ended')];
        await schedules().upsertSchedules([
          upsert(paused, { queue, nextRunAt: later(now, -HOUR) }),
          upsert(ended, { queue, nextRunAt: null }),
        ]);
        await schedules().setSchedulePaused(paused, true, null);
        expect((await schedules().scheduleDueIn()).dueInMs).toBeNull();

        await schedules().upsertSchedules([
          upsert(newScheduleId('duein-later'), { queue, nextRunAt: later(now, HOUR) }),
        ]);
        const waiting = await schedules().scheduleDueIn();
        expect(waiting.dueInMs).toBeGreaterThan(HOUR - 60_000);
        expect(waiting.dueInMs).toBeLessThanOrEqual(HOUR);

        await schedules().upsertSchedules([
          upsert(newScheduleId('duein-due'), { queue, nextRunAt: later(now, -1000) }),
        ]);
        expect((await schedules().scheduleDueIn()).dueInMs).toBeLessThanOrEqual(0);
      });

      it("fireDueSchedules enqueues the plan's jobs and advances the schedule in one transaction", async () => {
        const queue = newQueue('sched-fire');
        const [due, notDue, paused] = [
          newScheduleId('fire-due'),
          newScheduleId('fire-later'),
          newScheduleId('fire-paused'),
        ];
        const now = await dbNow();
        const tick = later(now, -1000);
        await schedules().upsertSchedules([
          upsert(due, { queue, payload: '{"report":"daily"}', options: '{"priority":4}', nextRunAt: tick }),
          upsert(notDue, { queue, nextRunAt: later(now, HOUR) }),
          upsert(paused, { queue, nextRunAt: tick }),
        ]);
        await schedules().setSchedulePaused(paused, true, null);

        const seen: { rows: ScheduleRow[]; now: Date }[] = [];
        const fired = await schedules().fireDueSchedules(10, (rows, at) => {
          seen.push({ rows: [...rows], now: at });
          return fireNext(rows, at);
        });
        expect(seen).toHaveLength(1);
        const [{ rows, now: planNow }] = seen as [{ rows: ScheduleRow[]; now: Date }];
        expect(rows.map((row) => row.id)).toEqual([due]);
        expect(rows[0]).toMatchObject({
          queue,
          payload: '{"report":"daily"}',
          options: '{"priority":4}',
          paused: false,
        });
        expect(rows[0]!.nextRunAt!.getTime()).toBe(tick.getTime());
        expect(planNow.getTime()).toBeGreaterThanOrEqual(tick.getTime());
        expect(fired.map((firing) => firing.id)).toEqual([due]);

        const claimed = await claimOne(queue);
        expect(claimed).toMatchObject({
          payload: { report: 'daily' },
          priority: 4,
          idempotencyKey: scheduleJobKey(due, tick),
        });
        const record = await schedules().getSchedule(due);
        expect(record!.nextRunAt!.getTime()).toBe(later(planNow, HOUR).getTime());
        expect(record!.lastTick!.getTime()).toBe(tick.getTime());
        expect(record!.lastRunAt!.getTime()).toBeGreaterThanOrEqual(tick.getTime());
        expect(record!.lastRunAt!.getTime()).toBeLessThan(later(planNow, 60_000).getTime());

        // Advanced: nothing is due any more, and a second round fires nothing.
        expect((await schedules().scheduleDueIn()).dueInMs).toBeGreaterThan(0);
        expect(await schedules().fireDueSchedules(10, fireNext)).toEqual([]);
        expect((await store.stats(queue)).ready).toBe(0);
        expect((await schedules().getSchedule(notDue))!.lastRunAt).toBeNull();
        expect((await schedules().getSchedule(paused))!.lastRunAt).toBeNull();
      });

      it('locks at most `limit` schedules per round, the earliest due first', async () => {
        const queue = newQueue('sched-limit');
        const now = await dbNow();
        const ids = [3, 1, 2].map((minutes) => ({
          id: newScheduleId(`limit-${minutes}`),
          at: later(now, -minutes * 60_000),
        }));
        await schedules().upsertSchedules(ids.map(({ id, at }) => upsert(id, { queue, nextRunAt: at })));
        const byAge = [...ids].sort((a, b) => a.at.getTime() - b.at.getTime()).map(({ id }) => id);
        const first = await schedules().fireDueSchedules(2, fireNext);
        expect(first.map((firing) => firing.id)).toEqual(byAge.slice(0, 2));
        const second = await schedules().fireDueSchedules(2, fireNext);
        expect(second.map((firing) => firing.id)).toEqual(byAge.slice(2));
        expect((await store.stats(queue)).ready).toBe(3);
      });

      it('a plan that throws leaves nothing enqueued and nothing advanced; the next round fires', async () => {
        const queue = newQueue('sched-throw');
        const id = newScheduleId('throw');
        const tick = later(await dbNow(), -1000);
        await schedules().upsertSchedules([upsert(id, { queue, nextRunAt: tick })]);
        await expect(
          schedules().fireDueSchedules(10, () => {
            throw new Error('plan failed');
          }),
        ).rejects.toThrow('plan failed');
        expect((await store.stats(queue)).ready).toBe(0);
        const kept = await schedules().getSchedule(id);
        expect(kept!.nextRunAt!.getTime()).toBe(tick.getTime());
        expect(kept!.lastRunAt).toBeNull();
        // The lock went with the rollback.
        expect((await schedules().fireDueSchedules(10, fireNext)).map((firing) => firing.id)).toEqual([id]);
        expect((await store.stats(queue)).ready).toBe(1);
      });

      it('a tick whose key is already in the queue returns the existing job and does not fail the firing', async () => {
        const queue = newQueue('sched-dup');
        const id = newScheduleId('dup');
        const now = await dbNow();
        const [missed, tick] = [later(now, -2 * 60_000), later(now, -60_000)];
        await schedules().upsertSchedules([upsert(id, { queue, nextRunAt: missed })]);
        // The later tick was enqueued already (a trigger, or a firing whose advance was lost).
        const [existing] = await store.enqueue([keyedAsTick(job(queue, { early: true }), id, tick)]);
        const fired = await schedules().fireDueSchedules(10, (rows, at) =>
          rows.map((row) => ({
            id: row.id,
            jobs: [tickJob(row, missed), tickJob(row, tick)],
            nextRunAt: later(at, HOUR),
            lastTick: tick,
          })),
        );
        expect(fired.map((firing) => firing.id)).toEqual([id]);
        expect((await store.stats(queue)).ready).toBe(2);
        expect((await store.getJob(existing!.jobId))!.payload).toEqual({ early: true });
        expect((await schedules().getSchedule(id))!.lastTick!.getTime()).toBe(tick.getTime());
      });

      it("a firing's jobs with a groupKey join their ordered group", async () => {
        const queue = newQueue('sched-group');
        const id = newScheduleId('group');
        const now = await dbNow();
        const ticks = [later(now, -3 * 60_000), later(now, -2 * 60_000), later(now, -60_000)];
        await schedules().upsertSchedules([upsert(id, { queue, options: '{"groupKey":"g"}', nextRunAt: ticks[0]! })]);
        // A job of the group already waiting: the ticks queue behind it.
        const [before] = await store.enqueue([job(queue, { before: true }, { groupKey: 'g' })]);
        await schedules().fireDueSchedules(10, (rows, at) =>
          rows.map((row) => ({
            id: row.id,
            jobs: ticks.map((tick) => tickJob(row, tick)),
            nextRunAt: later(at, HOUR),
            lastTick: ticks[2]!,
          })),
        );
        const keys: (string | null)[] = [];
        for (let i = 0; i < 4; i++) {
          const claimed = await store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: WORKER });
          // One at a time, in group order.
          expect(claimed).toHaveLength(1);
          expect(claimed[0]!.groupKey).toBe('g');
          if (i === 0) expect(claimed[0]!.id).toBe(before!.jobId);
          keys.push(claimed[0]!.idempotencyKey);
          await store.complete([{ id: claimed[0]!.id, claimToken: claimed[0]!.claimToken }]);
        }
        expect(keys).toEqual([null, ...ticks.map((tick) => scheduleJobKey(id, tick))]);
        expect(await store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: WORKER })).toEqual([]);
      });

      if (target.concurrentSessions) {
        it('instances firing at once never fire a schedule twice: each sees it locked or not due', async () => {
          const queue = newQueue('sched-concurrent');
          const now = await dbNow();
          const count = 20 * target.scale;
          const ids = Array.from({ length: count }, (_, i) => newScheduleId(`concurrent-${i}`));
          await schedules().upsertSchedules(ids.map((id) => upsert(id, { queue, nextRunAt: later(now, -1000) })));
          const instances = await openExtra(4);
          const fired: string[] = [];
          // Each round starts another instance's round while its own holds the locks.
          const rivals: Promise<ScheduleFiring[]>[] = [];
          await Promise.all(
            instances.map(async (instance, i) => {
              for (;;) {
                const firings = await schedules(instance).fireDueSchedules(3, (rows, at) => {
                  const rival = schedules(instances[(i + 1) % instances.length]).fireDueSchedules(3, fireNext);
                  // Awaited below; a failure is reported there, not as an unhandled rejection.
                  rival.catch(() => undefined);
                  rivals.push(rival);
                  return fireNext(rows, at);
                });
                if (firings.length === 0) return;
                fired.push(...firings.map((firing) => firing.id));
              }
            }),
          );
          for (const firings of await Promise.all(rivals)) fired.push(...firings.map((firing) => firing.id));
          expect(fired.sort()).toEqual([...ids].sort());
          expect((await store.stats(queue)).ready).toBe(count);
        });
      }

      it('getSchedule, listSchedules, deleteSchedule and setSchedulePaused', async () => {
        const queue = newQueue('sched-admin');
        const [a, b] = [newScheduleId('admin-a'), newScheduleId('admin-b')];
        expect(await schedules().getSchedule(a)).toBeNull();
        expect(await schedules().listSchedules()).toEqual([]);
        const now = await dbNow();
        await schedules().upsertSchedules([
          upsert(a, { queue, nextRunAt: later(now, -1000) }),
          upsert(b, { queue, nextRunAt: later(now, HOUR) }),
        ]);
        const listed = await schedules().listSchedules();
        expect(listed.map((row) => row.id).sort()).toEqual([a, b].sort());
        expect(listed.find((row) => row.id === a)).toEqual(await schedules().getSchedule(a));

        // Paused: not due, not fired.
        expect(await schedules().setSchedulePaused(a, true, null)).toBe(true);
        expect((await schedules().getSchedule(a))!.paused).toBe(true);
        expect((await schedules().scheduleDueIn()).dueInMs).toBeGreaterThan(0);
        expect(await schedules().fireDueSchedules(10, fireNext)).toEqual([]);
        // Resumed with the next tick after now: the paused period is not caught up.
        const resumeAt = later(now, 2 * HOUR);
        expect(await schedules().setSchedulePaused(a, false, resumeAt)).toBe(true);
        expect(await schedules().getSchedule(a)).toMatchObject({ paused: false, nextRunAt: resumeAt });
        expect(await schedules().fireDueSchedules(10, fireNext)).toEqual([]);
        expect(await schedules().setSchedulePaused('no.such.schedule', true, null)).toBe(false);

        expect(await schedules().deleteSchedule(a)).toBe(true);
        expect(await schedules().deleteSchedule(a)).toBe(false);
        expect(await schedules().getSchedule(a)).toBeNull();
        expect((await schedules().listSchedules()).map((row) => row.id)).toEqual([b]);
      });
    });
  });
}
