import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { DEFAULT_MAX_ATTEMPTS } from '../../lib/src/core/validation.js';
import { uniqueSchema } from '../helpers/databases.js';
import { producerRefusal, REFUSED_CALLS, type SqlEnqueueCall } from './sql-enqueue-cases.js';

/** A connection of the test's own, as an application's trigger, script or DBA would have. */
export interface SqlEnqueueSession {
  /** Calls the installed function or procedure (in the session's transaction, if one is open). */
  enqueue(call: SqlEnqueueCall): Promise<{ jobId: string; created: boolean }>;
  begin(): Promise<void>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
  /** An `orders` table whose AFTER INSERT trigger enqueues {orderId, total} to `queue`, keyed 'order:<id>'. */
  createOrderTrigger(queue: string): Promise<void>;
  insertOrder(id: number, total: number): Promise<void>;
  /** Runs `work` as a principal that has only what `grant` gave it, in a transaction rolled back after. */
  asPrincipal<T>(principal: string, work: () => Promise<T>): Promise<T>;
  createPrincipal(principal: string): Promise<void>;
  /** Runs the CLI's grants script for an enqueuer. */
  grantEnqueuer(principal: string): Promise<void>;
  /** A read of the jobs table, which an enqueuer may not do. */
  readJobs(): Promise<unknown>;
  close(): Promise<void>;
}

export interface SqlEnqueueTarget {
  name: string;
  openStore(schema: string): Promise<QueueStore>;
  connect(schema: string): Promise<SqlEnqueueSession>;
  /** The message of a refusal, after checking it is the dialect's error for a bad argument. */
  refusalMessage(error: unknown): string;
  /** The dialect's error when a principal may not call the enqueue. */
  notPermitted: RegExp;
  dropSchema(schema: string): Promise<void>;
  dropPrincipal(principal: string): Promise<void>;
}

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };

/**
 * Enqueue from SQL (issue 25): the function (PostgreSQL) or procedure (SQL Server) that migrations
 * install is producer.enqueue for triggers and scripts: the same validation and messages,
 * idempotency shared with the producer's keys, ordered groups, delays, the queue's recorded
 * maxAttempts, the caller's transaction (a rollback leaves nothing), and a principal that may call
 * only it.
 */
export function describeSqlEnqueueContract(target: SqlEnqueueTarget): void {
  describe(`SQL enqueue contract: ${target.name}`, () => {
    const schema = uniqueSchema('sqlenq');
    const principal = `${schema}_enqueuer`;
    let store: QueueStore;
    let session: SqlEnqueueSession;
    let seq = 0;
    const nextQueue = () => `sqlq.${++seq}`;

    beforeAll(async () => {
      store = await target.openStore(schema);
      await store.migrate('auto');
      session = await target.connect(schema);
    });

    afterAll(async () => {
      await session?.close();
      await store?.close();
      await target.dropSchema(schema);
      await target.dropPrincipal(principal);
    });

    it('stores a job the store claims, with its payload, priority and the default attempts, and no trace context', async () => {
      const queue = nextQueue();
      const result = await session.enqueue({ queue, payload: { order: 42 }, options: { priority: 5 } });
      expect(result.created).toBe(true);
      expect(await store.getJob(result.jobId)).toMatchObject({
        state: 'ready',
        queue,
        payload: { order: 42 },
        priority: 5,
        maxAttempts: DEFAULT_MAX_ATTEMPTS,
      });
      const [claimed] = await store.claim({ queue, limit: 1, leaseMs: 30_000, workerId: 'w' });
      expect(claimed?.id).toBe(result.jobId);
      expect(claimed?.traceContext ?? null).toBeNull();
    });

    it('gives the job producer.enqueue stored for the same key, and the producer gives the one it stored', async () => {
      const queue = nextQueue();
      const [fromProducer] = await store.enqueue([
        prepareJob(queue, { by: 'producer' }, { idempotencyKey: 'k1' }, LIMITS),
      ]);
      expect(await session.enqueue({ queue, payload: { by: 'sql' }, options: { idempotencyKey: 'k1' } })).toEqual({
        jobId: fromProducer!.jobId,
        created: false,
      });
      const fromSql = await session.enqueue({ queue, payload: { by: 'sql' }, options: { idempotencyKey: 'k2' } });
      const [again] = await store.enqueue([prepareJob(queue, { by: 'producer' }, { idempotencyKey: 'k2' }, LIMITS)]);
      expect(again).toEqual({ jobId: fromSql.jobId, created: false });
      expect((await store.getJob(fromSql.jobId))?.payload).toEqual({ by: 'sql' });
    });

    it("delays a job, and takes the queue's recorded maxAttempts when none is given", async () => {
      const queue = nextQueue();
      await store.recordQueueSettings([{ queue, maxAttempts: 7 }]);
      const delayed = await session.enqueue({ queue, payload: null, options: { delayMs: 60_000 } });
      const job = await store.getJob(delayed.jobId);
      expect(job).toMatchObject({ state: 'delayed', maxAttempts: 7, payload: null });
      expect(job!.runAt.getTime() - Date.now()).toBeGreaterThan(50_000);
      const own = await session.enqueue({
        queue,
        payload: {},
        options: { maxAttempts: 2, runAt: new Date(Date.now() - 1_000) },
      });
      expect(await store.getJob(own.jobId)).toMatchObject({ state: 'ready', maxAttempts: 2 });
    });

    it('joins ordered groups: the second job of a group waits for the first to finish', async () => {
      const queue = nextQueue();
      const first = await session.enqueue({ queue, payload: { n: 1 }, options: { groupKey: 'customer-1' } });
      const second = await session.enqueue({ queue, payload: { n: 2 }, options: { groupKey: 'customer-1' } });
      const claim = () => store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: 'w', groupBatchSize: 1 });
      const [head, ...rest] = await claim();
      expect(head?.id).toBe(first.jobId);
      expect(rest).toEqual([]);
      expect(await claim()).toEqual([]);
      await store.complete([{ id: head!.id, claimToken: head!.claimToken }]);
      expect((await claim()).map((j) => j.id)).toEqual([second.jobId]);
    });

    it("runs in the caller's transaction: a rollback leaves no job, a commit keeps it", async () => {
      const queue = nextQueue();
      await session.begin();
      const rolledBack = await session.enqueue({ queue, payload: {} });
      await session.rollback();
      expect(await store.getJob(rolledBack.jobId)).toBeNull();
      await session.begin();
      const committed = await session.enqueue({ queue, payload: {}, options: { idempotencyKey: 'tx' } });
      await session.commit();
      expect(await store.getJob(committed.jobId)).toMatchObject({ state: 'ready', idempotencyKey: 'tx' });
    });

    it("a trigger enqueues in the business transaction: the order's job exists exactly when the order does", async () => {
      const queue = nextQueue();
      await session.createOrderTrigger(queue);
      await session.begin();
      await session.insertOrder(1, 10);
      await session.rollback();
      expect((await store.stats(queue)).ready).toBe(0);
      await session.insertOrder(2, 20.5);
      const id = await store.findJobByKey(queue, 'order:2');
      expect(await store.getJob(id!)).toMatchObject({ payload: { orderId: 2, total: 20.5 }, state: 'ready' });
      expect((await store.stats(queue)).ready).toBe(1);
    });

    it.each(REFUSED_CALLS)("refuses $name with producer.enqueue's message", async ({ call }) => {
      const expected = producerRefusal(call);
      expect(expected).not.toBeNull();
      const error = await session.enqueue(call).then(
        () => new Error('accepted'),
        (e: unknown) => e,
      );
      expect(target.refusalMessage(error)).toBe(expected);
    });

    it('accepts what the producer accepts at the edges (the longest keys, the largest values)', async () => {
      const queue = nextQueue();
      const call: SqlEnqueueCall = {
        queue,
        payload: { note: 'é'.repeat(1000) },
        options: {
          groupKey: '😀'.repeat(127) + 'g',
          idempotencyKey: 'k'.repeat(255),
          priority: 32767,
          maxAttempts: 10_000,
          delayMs: 50 * 365 * 86_400_000,
        },
      };
      expect(producerRefusal(call)).toBeNull();
      const result = await session.enqueue(call);
      expect(result.created).toBe(true);
      expect(await store.getJob(result.jobId)).toMatchObject({ groupKey: call.options!.groupKey, priority: 32767 });
    });

    it('a principal with the printed grants can enqueue and nothing else; without them it cannot enqueue', async () => {
      await session.createPrincipal(principal);
      const queue = nextQueue();
      await expect(session.asPrincipal(principal, () => session.enqueue({ queue, payload: {} }))).rejects.toThrow(
        target.notPermitted,
      );
      await session.grantEnqueuer(principal);
      expect(
        (await session.asPrincipal(principal, () => session.enqueue({ queue, payload: { via: 'grant' } }))).created,
      ).toBe(true);
      await expect(session.asPrincipal(principal, () => session.readJobs())).rejects.toThrow(/permission|denied/i);
    });
  });
}
