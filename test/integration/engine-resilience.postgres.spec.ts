import { afterAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../lib/src/core/clock.js';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import { silentLogger } from '../../lib/src/core/logger.js';
import { resolveConsumerOptions, resolveQueueOptions, type QueueOptions } from '../../lib/src/core/options.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';
import { deferred, waitFor } from '../helpers/wait-for.js';

/**
 * The engine against a real PostgreSQL store whose replies a test can delay or swallow, as a
 * slow network or a half-open connection would: the engine must neither lose jobs nor hang.
 */
const schema = uniqueSchema('resilience');
afterAll(() => dropPgSchema(schema));

function engine(store: QueueStore, queue: string, options: QueueOptions, handler: () => Promise<void>) {
  const consumerOptions = resolveConsumerOptions({});
  const consumer = new SqlQueueConsumer({
    store,
    clock: systemClock,
    logger: silentLogger,
    listeners: [],
    wakeBus: new WakeBus(),
    workerId: 'resilience',
    listenForWakeups: false,
  });
  consumer.register(resolveQueueOptions(queue, { handler: options }, consumerOptions), handler);
  return consumer;
}

async function openStore(): Promise<QueueStore> {
  const store = createPostgresStore({ url: PG_URL, poolSize: 4 }, { schema });
  await store.migrate('auto');
  return store;
}

const limits = { maxPayloadBytes: 1024, defaultMaxAttempts: 1 };

describe('engine resilience', () => {
  it('gives back what a claim still in flight at shutdown brings, without spending an attempt', async () => {
    const store = await openStore();
    const queue = 'late-claim';
    const [job] = await store.enqueue([prepareJob(queue, { n: 1 }, {}, limits)]);
    const claimSent = deferred<void>();
    const slowClaims: QueueStore = Object.create(store);
    slowClaims.claim = async (request) => {
      claimSent.resolve();
      await new Promise((resolve) => setTimeout(resolve, 300));
      return store.claim(request);
    };
    let ran = false;
    const consumer = engine(slowClaims, queue, { minReaders: 1, maxReaders: 1 }, async () => {
      ran = true;
    });
    await consumer.start();
    await claimSent.promise;
    await consumer.stop(1_000);
    expect(ran).toBe(false);
    // maxAttempts is 1: had the attempt been spent, the reaper would make this job dead.
    expect(await store.getJob(job!.jobId)).toMatchObject({ state: 'ready', attempts: 0, claimToken: null });
    await store.close();
  });

  it('retries a completion whose reply never comes, instead of stalling the queue', async () => {
    const store = await openStore();
    const queue = 'hung-complete';
    const [job] = await store.enqueue([prepareJob(queue, { n: 1 }, {}, limits)]);
    let completes = 0;
    const hangsOnce: QueueStore = Object.create(store);
    hangsOnce.complete = (items) => {
      completes++;
      // The first completion commits but its reply is lost (a half-open connection).
      return completes === 1 ? store.complete(items).then(() => new Promise(() => undefined)) : store.complete(items);
    };
    const consumer = engine(hangsOnce, queue, { minReaders: 1, maxReaders: 1, leaseMs: 2_000 }, async () => {});
    await consumer.start();
    await waitFor(
      () => completes,
      (n) => n >= 2,
      { timeoutMs: 10_000, what: 'the completion to be retried' },
    );
    expect(await store.getJob(job!.jobId)).toMatchObject({ state: 'done' });
    await consumer.stop(1_000);
    await store.close();
  });

  it('keeps enforcing maxDurationMs while a heartbeat statement hangs', async () => {
    const store = await openStore();
    const queue = 'hung-heartbeat';
    const [job] = await store.enqueue([prepareJob(queue, { n: 1 }, {}, limits)]);
    const hangingHeartbeats: QueueStore = Object.create(store);
    hangingHeartbeats.heartbeat = () => new Promise(() => undefined);
    let reason: unknown = null;
    const consumer = engine(
      hangingHeartbeats,
      queue,
      { minReaders: 1, maxReaders: 1, leaseMs: 600, maxDurationMs: 1_200 },
      () =>
        new Promise<void>((resolve) => {
          // The handler resolves once aborted; the abort must come although heartbeats hang.
          const poll = setInterval(() => {
            if (reason) {
              clearInterval(poll);
              resolve();
            }
          }, 20);
        }),
    );
    // Observe the abort through the job's state: the timeout records the attempt as failed.
    await consumer.start();
    await waitFor(
      () => store.getJob(job!.jobId),
      (j) => j?.state === 'dead',
      {
        timeoutMs: 10_000,
        what: 'maxDurationMs to fail the job',
      },
    ).then(() => (reason = 'timed out'));
    expect((await store.getJob(job!.jobId))!.lastError).toMatch(/exceeded maxDurationMs=1200/);
    await consumer.stop(1_000);
    await store.close();
  });
});
