/**
 * waitFor() across processes (issue 23): a producer-only Nest application waits for a job that
 * a worker process runs. With wake-ups the worker answers the waiter's ask the moment it records
 * the completion, long before the waiter's next poll (its pauses have grown to 5 s by then);
 * without, the waiter finds it by polling, at most a second late. And nobody who does not wait
 * pays: a job finished with no waiter sends no notification.
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import type { INestApplicationContext } from '@nestjs/common';
import { QueueProducer } from '../../../lib/src/index.js';
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { createQueueApp } from '../../helpers/queue-app.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../../helpers/databases.js';
import { waitFor } from '../../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';

const schema = uniqueSchema('waitfor');
let store: QueueStore;
/** Every name sent on the schema's wake-up channel, as a third process hears them. */
const heard: string[] = [];
let stopListening: () => Promise<void>;
const apps: INestApplicationContext[] = [];

beforeAll(async () => {
  store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
  await store.migrate('auto');
  await createEffectTables(PG_URL, schema);
  stopListening = await store.listen!((name) => heard.push(name));
});
afterEach(async () => {
  await killAllWorkers();
  await Promise.all(apps.splice(0).map((app) => app.close()));
});
afterAll(async () => {
  await stopListening?.();
  await store?.close();
  await dropPgSchema(schema);
});

async function producerApp(wakeups: boolean): Promise<QueueProducer> {
  const { app } = await createQueueApp({
    schema,
    module: { consumer: { enabled: false }, wakeups: { enabled: wakeups } },
  });
  apps.push(app);
  return app.get(QueueProducer);
}

/** By then a waiter's pauses have grown past a second: 25 ms doubling, 3.2 s in all. */
const WAITER_SETTLED_MS = 3_500;

for (const wakeups of [true, false]) {
  it(`a waiter learns that a job another process ran finished ${wakeups ? 'at once (the worker answers its ask)' : 'by polling, within a second'}`, async () => {
    const queue = `wait-${wakeups ? 'notify' : 'poll'}`;
    const worker = await WorkerProcess.start({ url: PG_URL, schema, queue, mode: 'gated' });
    const producer = await producerApp(wakeups);
    if (wakeups) {
      // A first wait hears an answer: from then on the waiter knows consumers answer, and
      // lets its polling back off to 5 s.
      const { jobId: first } = await producer.enqueue(queue, { n: 0 }, { idempotencyKey: 'k-0' });
      await worker.next((m) => m.type === 'started' && m.jobId === first);
      const waited = producer.waitFor(first, { timeoutMs: 30_000 });
      worker.release(first, 'complete');
      expect((await waited).state).toBe('done');
    }
    heard.length = 0;
    const { jobId } = await producer.enqueue(queue, { n: 1 }, { idempotencyKey: 'k-1' });
    await worker.next((m) => m.type === 'started' && m.jobId === jobId);

    const waiting = producer.waitFor(jobId, { timeoutMs: 30_000 }).then((job) => ({ job, at: Date.now() }));
    await new Promise((resolve) => setTimeout(resolve, WAITER_SETTLED_MS));
    worker.release(jobId, 'complete');
    const { job, at } = await waiting;
    expect(job.state).toBe('done');
    // The database's finish time and this clock are the same machine's.
    const lateMs = at - job.finishedAt!.getTime();
    if (wakeups) {
      // This process's own LISTEN hears the ask and the answer too (maybe a moment after the waiter).
      await waitFor(
        async () => [`!await:${jobId}`, `!done:${jobId}`].every((name) => heard.includes(name)),
        (found) => found,
        { what: `the ask and the answer for job ${jobId}` },
      );
      // The next poll was up to 5 s away.
      expect(lateMs).toBeLessThan(1_500);
    } else {
      expect(heard.filter((name) => name.startsWith('!'))).toEqual([]);
      expect(lateMs).toBeLessThan(1_000 + 1_000);
    }
  });
}

it('a job finished with nobody waiting sends no ask or answer; a canceled ready job answers its waiter', async () => {
  const queue = 'wait-quiet';
  const worker = await WorkerProcess.start({ url: PG_URL, schema, queue });
  const producer = await producerApp(true);
  heard.length = 0;
  const { jobId } = await producer.enqueue(queue, { n: 2 }, { idempotencyKey: 'k-2' });
  await waitFor(
    async () => (await store.getJob(jobId))?.state,
    (state) => state === 'done',
    { what: 'the job to finish' },
  );
  await worker.stop();
  await new Promise((resolve) => setTimeout(resolve, 300));
  expect(heard.filter((name) => name.startsWith('!'))).toEqual([]);

  // No consumer runs now: cancel() itself tells the waiter.
  const { jobId: idle } = await producer.enqueue(queue, { n: 3 }, { idempotencyKey: 'k-3' });
  const waiting = producer.waitFor(idle, { timeoutMs: 30_000 });
  await new Promise((resolve) => setTimeout(resolve, WAITER_SETTLED_MS));
  const canceledAt = Date.now();
  expect((await producer.cancel(idle)).outcome).toBe('canceled');
  expect((await waiting).state).toBe('canceled');
  expect(Date.now() - canceledAt).toBeLessThan(1_500);
  // Woken here before the answer went out (for waiters elsewhere); it follows.
  await waitFor(
    async () => heard.includes(`!done:${idle}`),
    (found) => found,
    { what: `the answer for job ${idle}` },
  );
});

it('a producer-only app that waited closes its wake-up connection with the app', async () => {
  const listeners = async () =>
    Number(
      (
        await sql<{ n: string }>(
          PG_URL,
          // This schema's channel only: other test files listen on theirs meanwhile.
          "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'nestjs-sql-queue listener' AND query ILIKE 'LISTEN%' AND strpos(query, $1) > 0",
          [`${schema}_wake`],
        )
      )[0]!.n,
    );
  const before = await listeners();
  const producer = await producerApp(true);
  const { jobId } = await producer.enqueue('wait-close', { n: 4 }, { idempotencyKey: 'k-4' });
  await producer.cancel(jobId);
  expect((await producer.waitFor(jobId)).state).toBe('canceled');
  // A wait whose job is not finished yet opens the channel; it times out.
  const { jobId: open } = await producer.enqueue('wait-close', { n: 5 }, { idempotencyKey: 'k-5' });
  await expect(producer.waitFor(open, { timeoutMs: 300 })).rejects.toThrow(/still ready after 300 ms/);
  await waitFor(listeners, (n) => n === before + 1, { what: 'the waiter to listen' });
  await apps.pop()!.close();
  await waitFor(listeners, (n) => n === before, { what: 'the wake-up connection to close with the app' });
});
