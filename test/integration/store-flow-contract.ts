import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { ClaimedJob, EnqueueOptions, FlowLimits } from '../../lib/src/core/types.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { uniqueSchema } from '../helpers/databases.js';
import { waitFor } from '../helpers/wait-for.js';
import type { StoreTarget } from './store-contract.js';

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };
const WORKER = 'flow-worker';
const NONE: FlowLimits = { globalConcurrency: null, concurrencyPerKey: null, rateLimit: null, rateLimitPerKey: null };

/**
 * Flow control (issue 24) on a store: limits recorded as the queue's consumers record them, then
 * claims as a consumer makes them (`limited: true`), checked against what is leased.
 */
export function describeFlowContract(target: StoreTarget): void {
  describe(`flow control contract: ${target.name}`, () => {
    const schema = uniqueSchema(`flow${target.name.replace(/\W/g, '').toLowerCase()}`);
    let store: QueueStore;
    const opened: QueueStore[] = [];
    let queueSeq = 0;

    beforeAll(async () => {
      store = await target.openStore(schema, { poolSize: 4 });
      await store.migrate('auto');
    });

    afterAll(async () => {
      await Promise.all(opened.map((s) => s.close()));
      await store?.close();
      await target.dropSchema(schema);
    });

    async function limitedQueue(label: string, limits: Partial<FlowLimits>): Promise<string> {
      const queue = `${label}.${++queueSeq}`;
      await store.recordQueueSettings([{ queue, maxAttempts: 3, limits: { ...NONE, ...limits } }]);
      return queue;
    }

    async function enqueue(queue: string, count: number, options: EnqueueOptions = {}): Promise<string[]> {
      const jobs = Array.from({ length: count }, (_, n) => prepareJob(queue, { n }, options, LIMITS));
      return (await store.enqueue(jobs)).map((result) => result.jobId);
    }

    const claim = (queue: string, limit: number, on: QueueStore = store, leaseMs = 30_000) =>
      on.claim({ queue, limit, leaseMs, workerId: WORKER, limited: true });

    async function keysOf(jobs: readonly ClaimedJob[]): Promise<string[]> {
      const records = await Promise.all(jobs.map((job) => store.getJob(job.id)));
      return records.map((record) => record!.concurrencyKey!).sort();
    }

    const complete = (jobs: readonly ClaimedJob[]) =>
      store.complete(jobs.map((job) => ({ id: job.id, claimToken: job.claimToken })));

    it('concurrencyPerKey: at most N jobs of a key are leased at once; other keys are not held back; a completion frees its slot', async () => {
      const queue = await limitedQueue('perkey', { concurrencyPerKey: 2 });
      for (const key of ['a', 'b', 'c']) await enqueue(queue, 5, { concurrencyKey: key });
      const first = await claim(queue, 100);
      expect(await keysOf(first)).toEqual(['a', 'a', 'b', 'b', 'c', 'c']);
      expect(await claim(queue, 100)).toEqual([]);
      const [done] = first;
      await complete([done!]);
      const next = await claim(queue, 100);
      expect(await keysOf(next)).toEqual([(await store.getJob(done!.id))!.concurrencyKey]);
      expect((await store.stats(queue)).leased).toBe(6);
    });

    it('a retrying job holds no slot while it waits for its backoff, and a give-back frees its slot at once', async () => {
      const queue = await limitedQueue('retry-slot', { concurrencyPerKey: 1 });
      await enqueue(queue, 3, { concurrencyKey: 'k' });
      const [first] = await claim(queue, 10);
      await store.fail([
        {
          id: first!.id,
          claimToken: first!.claimToken,
          error: 'x',
          stack: null,
          retryDelayMs: 60_000,
          dead: false,
          workerId: WORKER,
        },
      ]);
      const [second] = await claim(queue, 10);
      expect(second, 'the next job of the key takes the slot the retrying one left').toBeDefined();
      expect(await claim(queue, 10)).toEqual([]);
      await store.release([{ id: second!.id, claimToken: second!.claimToken }]);
      expect(await claim(queue, 10)).toHaveLength(1);
    });

    it('a lease that expires (a crashed worker) frees its slot with it', async () => {
      const queue = await limitedQueue('crash-slot', { concurrencyPerKey: 1 });
      await enqueue(queue, 2, { concurrencyKey: 'k' });
      const [held] = await claim(queue, 10, store, 100);
      expect(await claim(queue, 10)).toEqual([]);
      await waitFor(
        async () => {
          await store.reap(100);
          return (await store.getJob(held!.id))?.state;
        },
        (state) => state === 'ready',
        { what: 'the expired lease to be reaped' },
      );
      expect(await claim(queue, 10)).toHaveLength(1);
    });

    it('keys are taken in turn: a key enqueued after a deep backlog of another starts within a claim or two', async () => {
      const queue = await limitedQueue('fair', { concurrencyPerKey: 100 });
      await enqueue(queue, 500, { concurrencyKey: 'a-big' });
      await enqueue(queue, 3, { concurrencyKey: 'b-small' });
      const seen: string[] = [];
      for (let round = 0; round < 3; round++) seen.push(...(await keysOf(await claim(queue, 2))));
      expect(seen.filter((key) => key === 'b-small')).toHaveLength(3);
    });

    it.runIf(target.concurrentSessions)(
      'starvation: 10 jobs of key B enqueued after 100,000 of key A all start within two claims of 10',
      async () => {
        const queue = await limitedQueue('starve', { concurrencyPerKey: 1_000 });
        for (let batch = 0; batch < 10; batch++) {
          await store.enqueue(
            Array.from({ length: 10_000 }, () => prepareJob(queue, { key: 'a' }, { concurrencyKey: 'a' }, LIMITS)),
          );
        }
        await store.enqueue(
          Array.from({ length: 10 }, () => prepareJob(queue, { key: 'b' }, { concurrencyKey: 'b' }, LIMITS)),
        );
        // A claim of n jobs with k keys waiting gives each key ceil(n / k): B's ten need
        // ceil(10 / ceil(10 / 2)) = 2 claims, however deep A's backlog.
        const bStartedIn: number[] = [];
        for (let round = 1; round <= 4; round++) {
          const jobs = await claim(queue, 10);
          expect(jobs).toHaveLength(10);
          for (const job of jobs) if ((job.payload as { key: string }).key === 'b') bStartedIn.push(round);
          await complete(jobs);
        }
        expect(bStartedIn).toEqual([1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
      },
      120_000,
    );

    it('jobs without a key share the queue with keyed ones: each gets its turn', async () => {
      const queue = await limitedQueue('mixed', { concurrencyPerKey: 1 });
      await enqueue(queue, 3, { concurrencyKey: 'k' });
      await enqueue(queue, 3);
      const claimed = await claim(queue, 10);
      const keys = await Promise.all(claimed.map(async (job) => (await store.getJob(job.id))!.concurrencyKey));
      expect(keys.filter((key) => key === 'k')).toHaveLength(1);
      expect(keys.filter((key) => key === null)).toHaveLength(3);
    });

    it('globalConcurrency: at most N jobs of the queue are leased at once', async () => {
      const queue = await limitedQueue('global', { globalConcurrency: 3 });
      await enqueue(queue, 10);
      expect(await claim(queue, 10)).toHaveLength(3);
      expect(await claim(queue, 10)).toEqual([]);
      await enqueue(queue, 4, { concurrencyKey: 'k' });
      expect(await claim(queue, 10), 'keyed jobs count against the queue too').toEqual([]);
    });

    it('rateLimit: at most max starts in any window of perMs, counted at the claim by the database clock', async () => {
      const queue = await limitedQueue('rate', { rateLimit: { max: 5, perMs: 1_000 } });
      await enqueue(queue, 20);
      const first = await claim(queue, 100);
      expect(first).toHaveLength(5);
      await complete(first);
      expect(await claim(queue, 100), 'completions do not give starts back').toEqual([]);
      const again = await waitFor(
        () => claim(queue, 100),
        (jobs) => jobs.length > 0,
        { what: 'the window to move on', timeoutMs: 5_000 },
      );
      expect(again).toHaveLength(5);
      expect(again[0]!.claimedAt.getTime() - first[0]!.claimedAt.getTime()).toBeGreaterThanOrEqual(1_000);
    });

    it('rateLimitPerKey: each key has its own window; a postponed job makes its whole key wait', async () => {
      const queue = await limitedQueue('keyrate', { rateLimitPerKey: { max: 2, perMs: 60_000 } });
      await enqueue(queue, 4, { concurrencyKey: 'a' });
      await enqueue(queue, 4, { concurrencyKey: 'b' });
      const first = await claim(queue, 100);
      expect(await keysOf(first)).toEqual(['a', 'a', 'b', 'b']);
      expect(await claim(queue, 100)).toEqual([]);

      const postponing = await limitedQueue('keywait', { rateLimitPerKey: { max: 100, perMs: 1_000 } });
      await enqueue(postponing, 3, { concurrencyKey: 'a' });
      await enqueue(postponing, 3, { concurrencyKey: 'b' });
      const [one] = await claim(postponing, 1);
      const key = (await store.getJob(one!.id))!.concurrencyKey;
      await store.release([{ id: one!.id, claimToken: one!.claimToken, delayMs: 60_000 }]);
      const rest = await claim(postponing, 100);
      expect(new Set(await keysOf(rest))).toEqual(new Set([key === 'a' ? 'b' : 'a']));
    });

    it('a paused queue leases nothing through the flow claim either', async () => {
      const queue = await limitedQueue('paused', { concurrencyPerKey: 1 });
      await enqueue(queue, 2, { concurrencyKey: 'k' });
      await store.pauseQueue(queue, null);
      expect(await claim(queue, 10)).toEqual([]);
      await store.resumeQueue(queue);
      expect(await claim(queue, 10)).toHaveLength(1);
    });

    it('a consumer that booted without limits follows the ones recorded after it (the ordinary claim hands over)', async () => {
      const queue = await limitedQueue('late-limits', { globalConcurrency: 2 });
      await enqueue(queue, 5);
      const ordinary = () => store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: WORKER });
      expect(await ordinary()).toHaveLength(2);
      expect(await ordinary()).toEqual([]);
      expect((await store.stats(queue)).leased).toBe(2);
    });

    it('a queue with keyed jobs and no limits is claimed in turns too (the ordinary claim hands over)', async () => {
      const queue = `unlimited.${++queueSeq}`;
      await enqueue(queue, 5);
      await enqueue(queue, 5, { concurrencyKey: 'k' });
      const claimed = await store.claim({ queue, limit: 100, leaseMs: 30_000, workerId: WORKER });
      expect(claimed).toHaveLength(10);
      expect(new Set(claimed.map((job) => job.id)).size).toBe(10);
    });

    it.runIf(target.concurrentSessions)(
      'races: claimers on separate connections never lease more than the key limit, or the global one, over hundreds of rounds',
      async () => {
        const queue = await limitedQueue('race', { concurrencyPerKey: 2, globalConcurrency: 5 });
        const keys = Array.from({ length: 4 }, (_, n) => `key-${n}`);
        for (const key of keys) {
          await store.enqueue(
            Array.from({ length: 80 }, () => prepareJob(queue, { key }, { concurrencyKey: key }, LIMITS)),
          );
        }
        // Jobs without a key: the ordinary claim's SKIP LOCKED would pass another claimer's rows.
        await store.enqueue(Array.from({ length: 80 }, () => prepareJob(queue, { key: null }, {}, LIMITS)));
        const claimers = await Promise.all(Array.from({ length: 8 }, () => target.openStore(schema, { poolSize: 1 })));
        opened.push(...claimers);
        // A job is counted from its claim until just before its completion is sent: while
        // counted it is certainly leased, so a count over the limit is a real double lease.
        const inHand = new Map<string | null, number>();
        let total = 0;
        const violations: string[] = [];
        let done = 0;
        const keyOf = (job: ClaimedJob) => (job.payload as { key: string | null }).key;
        await Promise.all(
          claimers.map(async (claimer, index) => {
            for (let round = 0; done < 400 && round < 2_000; round++) {
              const jobs = await claim(queue, 1 + ((round + index) % 4), claimer);
              for (const job of jobs) {
                const now = (inHand.get(keyOf(job)) ?? 0) + 1;
                inHand.set(keyOf(job), now);
                total++;
                if (now > 2 && keyOf(job) !== null) violations.push(`${keyOf(job)} had ${now}`);
                if (total > 5) violations.push(`${total} in all`);
              }
              // Completing at once keeps claimers overlapping (a pause here made the race too rare to see).
              await new Promise((resolve) => setImmediate(resolve));
              for (const job of jobs) {
                inHand.set(keyOf(job), inHand.get(keyOf(job))! - 1);
                total--;
              }
              await claimer.complete(jobs.map((job) => ({ id: job.id, claimToken: job.claimToken })));
              done += jobs.length;
            }
          }),
        );
        expect(violations).toEqual([]);
        expect(done).toBe(400);
      },
      60_000,
    );
  });
}
