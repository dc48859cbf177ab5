import pg from 'pg';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { SqlQueueClosedError } from '../../lib/src/core/errors.js';
import { QueueProducerCore } from '../../lib/src/core/producer/producer.js';
import type { EnqueueResult } from '../../lib/src/core/types.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import { QueueProducer } from '../../lib/src/index.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { queueAppSuite } from '../helpers/queue-app.js';

const db = migratedPgStore('batching', 4);

/** The producer as the module builds it by default (batching on), with its statements counted. */
function batchedProducer() {
  const enqueue = vi.spyOn(db.store, 'enqueue');
  const producer = new QueueProducerCore(
    db.store,
    {
      maxPayloadBytes: 1024 * 1024,
      maxAttemptsFor: () => 3,
      enqueueBatching: { enabled: true, maxBatchSize: 500, maxInFlight: 2, windowUs: 0 },
    },
    new WakeBus(),
    null,
  );
  return { producer, statements: () => enqueue.mock.calls };
}

afterEach(() => vi.restoreAllMocks());

async function payloadOf(jobId: string): Promise<unknown> {
  return (await db.store.getJob(jobId))!.payload;
}

describe('single enqueues batched on PostgreSQL', () => {
  it('a keyed batch whose key look-up fails stores nothing, so sending its jobs again stores each once', async () => {
    const { producer } = batchedProducer();
    await producer.enqueue('lookup', { first: true }, { idempotencyKey: 'taken' });
    // The batch's insert conflicts on 'taken'; the look-up that follows fails as the server would
    // (a statement timeout). Were the insert committed alone, the retry would store its jobs twice.
    const store = db.store as unknown as { run(client: unknown, name: string, params: unknown[]): Promise<unknown[]> };
    const run = store.run.bind(store);
    let failed = false;
    vi.spyOn(store, 'run').mockImplementation(async (client, name, params) => {
      if (name === 'findByIdempotencyKeys' && !failed) {
        failed = true;
        throw Object.assign(new Error('canceling statement due to statement timeout'), {
          severity: 'ERROR',
          code: '57014',
        });
      }
      return run(client, name, params);
    });
    const results = await Promise.all([
      producer.enqueue('lookup', { a: 1 }),
      producer.enqueue('lookup', { again: true }, { idempotencyKey: 'taken' }),
      producer.enqueue('lookup', { b: 2 }),
    ]);
    expect(failed).toBe(true);
    expect(results.map((r) => r.created)).toEqual([true, false, true]);
    const [{ count }] = await sql<{ count: string }>(
      PG_URL,
      `SELECT count(*) AS count FROM "${db.schema}".jobs WHERE queue = 'lookup'`,
    );
    expect(Number(count)).toBe(3);
  });

  it('callers of one idempotency key, interleaved with others, get one job, created for exactly one; each caller gets its own result', async () => {
    const { producer, statements } = batchedProducer();
    // 60 calls in one turn: every third one carries one of four keys, five callers per key.
    const calls = Array.from({ length: 60 }, (_, i) => ({
      i,
      key: i % 3 === 0 ? `order-${(i / 3) % 4}` : undefined,
    }));
    const results = await Promise.all(
      calls.map(({ i, key }) => producer.enqueue('keys', { i }, key === undefined ? {} : { idempotencyKey: key })),
    );
    expect(statements()).toHaveLength(1);
    expect(statements()[0]![0]).toHaveLength(60);

    for (const key of ['order-0', 'order-1', 'order-2', 'order-3']) {
      const callers = calls.filter((call) => call.key === key).map((call) => ({ ...call, result: results[call.i]! }));
      expect(new Set(callers.map((c) => c.result.jobId)).size).toBe(1);
      const creators = callers.filter((c) => c.result.created);
      expect(creators).toHaveLength(1);
      // The one told "created" is the caller whose payload the job holds.
      expect(await payloadOf(creators[0]!.result.jobId)).toEqual({ i: creators[0]!.i });
    }
    for (const { i } of calls.filter((call) => call.key === undefined)) {
      expect(results[i]!.created).toBe(true);
      expect(await payloadOf(results[i]!.jobId)).toEqual({ i });
    }
    const [{ count }] = await sql<{ count: string }>(
      PG_URL,
      `SELECT count(*) FROM "${db.schema}".jobs WHERE queue = 'keys'`,
    );
    expect(Number(count)).toBe(4 + 40);
  });

  it('keys shared by 16 concurrent producers across many statements still name one job each', async () => {
    const { producer, statements } = batchedProducer();
    const byKey = new Map<string, EnqueueResult[]>();
    let next = 0;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (next < 400) {
          const key = `k-${next++ % 25}`;
          const result = await producer.enqueue('shared', { key }, { idempotencyKey: key });
          byKey.set(key, [...(byKey.get(key) ?? []), result]);
        }
      }),
    );
    expect(statements().length).toBeLessThan(400);
    expect(byKey.size).toBe(25);
    for (const results of byKey.values()) {
      expect(results).toHaveLength(16);
      expect(new Set(results.map((r) => r.jobId)).size).toBe(1);
      expect(results.filter((r) => r.created)).toHaveLength(1);
    }
  });

  it('a job the database refuses fails its own caller only; the others are stored', async () => {
    const { producer, statements } = batchedProducer();
    // Something validation cannot know about: the application's own constraint on the table.
    await sql(PG_URL, `ALTER TABLE "${db.schema}".jobs ADD CONSTRAINT no_poison CHECK (payload->>'poison' IS NULL)`);
    try {
      const outcomes = await Promise.allSettled(
        Array.from({ length: 10 }, (_, i) => producer.enqueue('refused', i === 4 ? { i, poison: true } : { i })),
      );
      expect(outcomes[4]).toMatchObject({ status: 'rejected', reason: { code: '23514', constraint: 'no_poison' } });
      for (const [i, outcome] of outcomes.entries()) {
        if (i === 4) continue;
        expect(outcome.status).toBe('fulfilled');
        expect(await payloadOf((outcome as PromiseFulfilledResult<EnqueueResult>).value.jobId)).toEqual({ i });
      }
      // The batch of ten was refused whole, then each job went alone.
      expect(statements().map(([jobs]) => jobs.length)).toEqual([10, ...Array<number>(10).fill(1)]);
      expect((await db.store.stats('refused')).ready).toBe(9);
    } finally {
      await sql(PG_URL, `ALTER TABLE "${db.schema}".jobs DROP CONSTRAINT no_poison`);
    }
  });

  it("a call in the caller's transaction is never batched: it commits or rolls back with the caller, the others do not wait", async () => {
    const { producer, statements } = batchedProducer();
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    try {
      await client.query('BEGIN');
      const [inTransaction, ...others] = await Promise.all([
        producer.enqueue('tx', { inTransaction: true }, { transaction: client }),
        ...Array.from({ length: 20 }, (_, i) => producer.enqueue('tx', { i })),
      ]);
      expect(statements().map(([jobs, transaction]) => [jobs.length, transaction === client])).toEqual([
        [1, true],
        [20, false],
      ]);
      // The batch committed on its own while the caller's transaction is still open.
      expect((await db.store.stats('tx')).ready).toBe(20);
      await client.query('ROLLBACK');
      expect(await db.store.getJob(inTransaction!.jobId)).toBeNull();
      expect(others.every((r) => r.created)).toBe(true);
      expect((await db.store.stats('tx')).ready).toBe(20);
    } finally {
      await client.end();
    }
  });
});

describe('application shutdown', () => {
  const suite = queueAppSuite('batchclose');

  it('stores the enqueues still waiting for a statement before closing the pool, and refuses later ones', async () => {
    const { app } = await suite.boot({
      module: { enqueueBatching: { maxBatchSize: 5, maxInFlight: 1 }, consumer: { enabled: false } },
    });
    suite.forget(app);
    const producer = app.get(QueueProducer);
    // 100 calls at five per statement, one statement at a time: most still wait when close begins.
    const calls = Array.from({ length: 100 }, (_, i) => producer.enqueue('closing', { i }));
    await app.close();
    const results = await Promise.all(calls);
    expect(results.every((r) => r.created)).toBe(true);
    const [{ count }] = await sql<{ count: string }>(
      PG_URL,
      `SELECT count(*) FROM "${suite.schema}".jobs WHERE queue = 'closing'`,
    );
    expect(Number(count)).toBe(100);

    await expect(producer.enqueue('closing', { late: true })).rejects.toThrow(SqlQueueClosedError);
  });
});
