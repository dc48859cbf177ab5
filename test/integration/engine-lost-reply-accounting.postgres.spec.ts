import { afterAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../lib/src/core/clock.js';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import type { QueueOptions } from '../../lib/src/core/options.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';
import { capturingLogger, consumerDeps, queueOptions, untilAborted } from '../helpers/engine.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * Regression, found in review. Before the fix, the acker retries an outcome statement whose reply was lost
 * after the database committed. For completions the retry is answered 'already' and counted as completed
 * (drill 3). For failures the retry is also answered 'already', but flushFailures() only reports 'ok' and
 * 'lost': an 'already' failure emits no `failed` event and logs nothing, so a job that went DEAD is never
 * logged as dead nor counted (deadLettered/retried metrics undercount). For give-backs the release statement
 * has no 'already' answer at all: the retry says 'lost', and a successful release is logged and counted as
 * lost ownership.
 */
const schema = uniqueSchema('review_lostreply');
afterAll(() => dropPgSchema(schema));

const limits = { maxPayloadBytes: 1024, defaultMaxAttempts: 1 };

function engine(store: QueueStore, queue: string, options: QueueOptions, handler: () => Promise<void>) {
  const events: { name: string; event: unknown }[] = [];
  const { logger, lines: logs } = capturingLogger('log', 'warn', 'error');
  const listener: QueueEventListener = {
    failed: (event) => events.push({ name: 'failed', event }),
    completed: (event) => events.push({ name: 'completed', event }),
    lostOwnership: (event) => events.push({ name: 'lostOwnership', event }),
  };
  const consumer = new SqlQueueConsumer(
    consumerDeps(store, systemClock, {
      logger,
      listeners: [listener],
      workerId: 'review',
      listenForWakeups: false,
    }),
  );
  consumer.register(queueOptions(options, queue), handler);
  return { consumer, events, logs };
}

async function openStore(): Promise<QueueStore> {
  const store = createPostgresStore({ url: PG_URL, poolSize: 4 }, { schema });
  await store.migrate('auto');
  return store;
}

/**
 * A view of `store` whose first `method` statement commits but loses its reply (the connection
 * drops before it comes back); `sent.count` counts the statements sent.
 */
function losingFirstReply(store: QueueStore, method: 'fail' | 'release') {
  const sent = { count: 0 };
  const send = store[method].bind(store) as (items: never) => Promise<unknown>;
  const lossy: QueueStore = Object.create(store);
  Object.assign(lossy, {
    [method]: async (items: never) => {
      sent.count++;
      const result = await send(items);
      if (sent.count === 1)
        throw Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' });
      return result;
    },
  });
  return { lossy, sent };
}

describe('outcome replies lost after commit', () => {
  it('a failure whose reply was lost is still reported as failed (here: dead)', async () => {
    const store = await openStore();
    const queue = 'lost-fail-reply';
    const [job] = await store.enqueue([prepareJob(queue, { n: 1 }, {}, limits)]);
    const { lossy, sent: fails } = losingFirstReply(store, 'fail');
    const { consumer, events, logs } = engine(lossy, queue, { minReaders: 1, maxReaders: 1 }, async () => {
      throw new Error('boom');
    });
    await consumer.start();
    await waitFor(
      () => fails.count,
      (n) => n >= 2,
      { what: 'the failure to be retried' },
    );
    await consumer.stop(1_000);
    expect(await store.getJob(job!.jobId)).toMatchObject({ state: 'dead', lastError: 'boom' });
    expect(events.filter((e) => e.name === 'lostOwnership')).toEqual([]);
    expect(logs.filter((l) => l.includes('is dead after attempt'))).toHaveLength(1);
    expect(events.filter((e) => e.name === 'failed')).toHaveLength(1);
    await store.close();
  });

  it('a give-back whose reply was lost is not reported as lost ownership', async () => {
    const store = await openStore();
    const queue = 'lost-release-reply';
    const [job] = await store.enqueue([prepareJob(queue, { n: 1 }, {}, limits)]);
    const { lossy, sent: releases } = losingFirstReply(store, 'release');
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    // A handler that obeys shutdown: aborted by stop(), the job is given back (attempt not counted).
    const { consumer, events, logs } = engine(lossy, queue, { minReaders: 1, maxReaders: 1 }, ((
      _payload: unknown,
      ctx: JobContext,
    ) => {
      started();
      return untilAborted(ctx.signal);
    }) as () => Promise<void>);
    await consumer.start();
    await running;
    await consumer.stop(0);
    expect(releases.count).toBe(2);
    expect(await store.getJob(job!.jobId)).toMatchObject({ state: 'ready', attempts: 0, claimToken: null });
    expect(logs.filter((l) => l.includes('give-back refused'))).toEqual([]);
    expect(events.filter((e) => e.name === 'lostOwnership')).toEqual([]);
    await store.close();
  });
});
