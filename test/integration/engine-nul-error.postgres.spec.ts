import { afterAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../lib/src/core/clock.js';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';
import { consumerDeps, queueOptions } from '../helpers/engine.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * Regression, found in review. Before the fix, payloads with U+0000 are refused before any SQL because
 * PostgreSQL cannot store it, but a handler's error message and stack go into the fail statement unfiltered.
 * One error text with a NUL byte (decoded binary data, a C library's message) makes the whole failure batch
 * throw ("unsupported Unicode escape sequence"). The acker retries that batch on every error until 2 x
 * leaseMs, and flushes no completion while failures fail: the poisoned job's failure is never recorded, the
 * other failures of its batch are dropped, and every completion of the queue waits behind it.
 */
const schema = uniqueSchema('review_nul');
afterAll(() => dropPgSchema(schema));

describe('a handler error containing U+0000', () => {
  it('is recorded (sanitized) and does not hold back other outcomes', async () => {
    const store: QueueStore = createPostgresStore({ url: PG_URL, poolSize: 4 }, { schema });
    await store.migrate('auto');
    const queue = 'nul-error';
    const limits = { maxPayloadBytes: 1024, defaultMaxAttempts: 5 };
    const [bad, good] = await store.enqueue([
      prepareJob(queue, { kind: 'bad' }, {}, limits),
      prepareJob(queue, { kind: 'good' }, {}, limits),
    ]);
    const consumer = new SqlQueueConsumer(
      consumerDeps(store, systemClock, { workerId: 'review', listenForWakeups: false }),
    );
    consumer.register(queueOptions({ minReaders: 2, maxReaders: 2, leaseMs: 10_000 }, queue), async (payload) => {
      if ((payload as { kind: string }).kind === 'bad') throw new Error('device replied "OK\u0000\u0000"');
      await new Promise((resolve) => setTimeout(resolve, 50)); // completes just after the failure
    });
    await consumer.start();
    try {
      const done = await waitFor(
        () => store.getJob(good!.jobId),
        (job) => job?.state === 'done',
        { timeoutMs: 3_000, what: 'the good job to complete' },
      ).catch((error: Error) => error);
      expect(done).not.toBeInstanceOf(Error);
      const failed = await store.getJob(bad!.jobId);
      expect(failed).toMatchObject({ state: 'delayed' }); // retried after its backoff
      expect(failed!.lastError).toContain('device replied');
    } finally {
      await consumer.stop(1_000);
      await store.close();
    }
  });
});
