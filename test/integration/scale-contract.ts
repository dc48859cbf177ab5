import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { desiredReaders } from '../../lib/src/core/scaling/index.js';
import type { EnqueueOptions } from '../../lib/src/core/types.js';
import { uniqueSchema } from '../helpers/databases.js';

/** A dialect's side of the scale recommendation, as KEDA's SQL scaler sees it. */
export interface ScaleTarget {
  name: string;
  openStore(schema: string): Promise<QueueStore>;
  /** The installed function's or procedure's answer for `queue`. */
  desiredReaders(schema: string, queue: string): Promise<number>;
  /**
   * Adds `completed` completions that took `busyMs` in all to the throughput bucket `minutesAgo`
   * whole minutes before the current one (0: the current).
   */
  addCompletions(schema: string, queue: string, minutesAgo: number, completed: number, busyMs: number): Promise<void>;
  /** Creates `principal`, gives it what the CLI prints, and runs `work` as it. */
  asGrantedScaler<T>(
    schema: string,
    principal: string,
    work: (read: { desiredReaders(queue: string): Promise<number>; readJobs(): Promise<unknown> }) => Promise<T>,
  ): Promise<T>;
  dropSchema(schema: string): Promise<void>;
  dropPrincipal(principal: string): Promise<void>;
}

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };

/**
 * The scale recommendation in the database (issue 26): the function (PostgreSQL) or procedure
 * (SQL Server) that KEDA's scalers query gives the number core/scaling's desiredReaders gives on
 * the store's scaleInputs, on real states (a backlog, running jobs with measured completions, a
 * key at its limit, a blocked group, a pause); a principal with only the printed grants can read it
 * and nothing else.
 */
export function describeScaleContract(target: ScaleTarget): void {
  describe(`scale recommendation contract: ${target.name}`, () => {
    const schema = uniqueSchema('scale');
    const principal = `${schema}_scaler`;
    let store: QueueStore;
    let seq = 0;

    async function enqueue(queue: string, count: number, options: EnqueueOptions = {}) {
      await store.enqueue(Array.from({ length: count }, (_, i) => prepareJob(queue, { i }, options, LIMITS)));
    }

    /** The database's answer, checked against the core rule on the store's inputs. */
    async function recommendation(queue: string): Promise<number> {
      const expected = desiredReaders(await store.scaleInputs!(queue));
      expect(await target.desiredReaders(schema, queue)).toBe(expected);
      return expected;
    }

    beforeAll(async () => {
      store = await target.openStore(schema);
      await store.migrate('auto');
    });

    afterAll(async () => {
      await store?.close();
      await target.dropSchema(schema);
      await target.dropPrincipal(principal);
    });
    it('is 0 for a queue with no work, and 1 for a small backlog nobody consumes yet (scale from zero)', async () => {
      const queue = `scale.${++seq}`;
      expect(await recommendation(queue)).toBe(0);
      await enqueue(queue, 30);
      expect(await store.scaleInputs!(queue)).toMatchObject({ claimable: 30, running: 0, completedInWindow: 0 });
      expect(await recommendation(queue)).toBe(1);
      await enqueue(queue, 5, { delayMs: 60_000 }); // not due: not claimable
      expect((await store.scaleInputs!(queue)).claimable).toBe(30);
    });

    it('counts the running jobs and sizes the rest of the backlog by the run time measured from completions', async () => {
      const queue = `scale.${++seq}`;
      await enqueue(queue, 30);
      await store.claim({ queue, limit: 5, leaseMs: 60_000, workerId: 'w' });
      // 3,000 completions of 500 ms in the last whole minutes: 5 readers busy on average, and the
      // 25 waiting drain in 60 s with one more.
      await target.addCompletions(schema, queue, 2, 3000, 1_500_000);
      expect(await store.scaleInputs!(queue)).toMatchObject({
        claimable: 25,
        running: 5,
        completedInWindow: 3000,
        busyMsInWindow: 1_500_000,
      });
      expect(await recommendation(queue)).toBe(6);
      // The current minute is not in the window (processes flush into it as it goes). Not within
      // a few seconds of the next minute, which would move the bucket into the window.
      while (new Date().getUTCSeconds() >= 55) await new Promise((resolve) => setTimeout(resolve, 500));
      await target.addCompletions(schema, queue, 0, 99, 99_000);
      expect((await store.scaleInputs!(queue)).completedInWindow).toBe(3000);
    });

    it('counts every due keyed job when the queue sets no concurrencyPerKey', async () => {
      const queue = `scale.${++seq}`;
      await enqueue(queue, 10, { concurrencyKey: 'tenant-a' });
      await store.claim({ queue, limit: 4, leaseMs: 60_000, workerId: 'w' });
      expect(await store.scaleInputs!(queue)).toMatchObject({ claimable: 6, running: 4 });
      await recommendation(queue);
    });

    it('leaves out keyed jobs whose key is at its concurrencyPerKey, and caps by globalConcurrency', async () => {
      const queue = `scale.${++seq}`;
      await store.recordQueueSettings([
        {
          queue,
          maxAttempts: 3,
          limits: { concurrencyPerKey: 1, globalConcurrency: 1, rateLimit: null, rateLimitPerKey: null },
        },
      ]);
      await enqueue(queue, 10, { concurrencyKey: 'tenant-a' });
      await enqueue(queue, 3, { concurrencyKey: 'tenant-b' });
      expect((await store.scaleInputs!(queue)).claimable).toBe(2); // one per key
      const [taken] = await store.claim({ queue, limit: 1, leaseMs: 60_000, workerId: 'w' });
      expect(taken).toBeDefined();
      expect(await store.scaleInputs!(queue)).toMatchObject({ claimable: 1, running: 1, globalConcurrency: 1 });
      expect(await recommendation(queue)).toBe(1);
    });

    it('counts an ordered group once, by its head, and not at all while a dead job blocks it', async () => {
      const queue = `scale.${++seq}`;
      await store.recordQueueSettings([{ queue, maxAttempts: 1, groupOnDead: 'block' }]);
      await enqueue(queue, 4, { groupKey: 'customer-1' });
      await enqueue(queue, 2, { groupKey: 'customer-2' });
      expect((await store.scaleInputs!(queue)).claimable).toBe(2);
      const claimed = await store.claim({ queue, limit: 10, leaseMs: 60_000, workerId: 'w', groupBatchSize: 1 });
      const head = claimed.find((job) => job.groupKey === 'customer-1')!;
      await store.fail([
        {
          id: head.id,
          claimToken: head.claimToken,
          error: 'boom',
          stack: null,
          retryDelayMs: 0,
          dead: true,
          workerId: 'w',
        },
      ]);
      const other = claimed.find((job) => job.groupKey === 'customer-2')!;
      await store.complete([{ id: other.id, claimToken: other.claimToken }]);
      await expect.poll(async () => (await store.scaleInputs!(queue)).claimable).toBe(1); // customer-2's next; customer-1 blocked
      expect((await store.stats(queue)).blockedGroups).toBe(1);
      expect(await recommendation(queue)).toBe(1);
    });

    it('is 0 for a paused queue, whatever waits in it', async () => {
      const queue = `scale.${++seq}`;
      await enqueue(queue, 100);
      await store.pauseQueue!(queue, null);
      expect(await recommendation(queue)).toBe(0);
    });

    it('a principal with the printed grants can read it, and cannot read the tables', async () => {
      const queue = `scale.${++seq}`;
      await enqueue(queue, 3);
      await target.asGrantedScaler(schema, principal, async (as) => {
        expect(await as.desiredReaders(queue)).toBe(1);
        await expect(as.readJobs()).rejects.toThrow(/permission|denied/i);
      });
    });
  });
}
