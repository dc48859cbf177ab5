/**
 * Canceling a running job across processes (issue 23): a real worker process runs a handler
 * that ignores its abort signal and never returns; this test process cancels the job through
 * the Nest producer's core. The worker learns of it (by the NOTIFY wake-up, well before its next
 * routine heartbeat), aborts the handler, records the attempt as canceled, and the job is not
 * retried; with wake-ups off, the next heartbeat brings the same news within a third of the lease.
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { QueueProducerCore } from '../../../lib/src/core/producer/index.js';
import { RemoteWaker, WakeBus } from '../../../lib/src/core/wake.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../../helpers/databases.js';
import { enqueueKeys } from '../../helpers/drills.js';
import { waitFor } from '../../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';

const schema = uniqueSchema('cancel');
const LEASE_MS = 6_000;
let store: QueueStore;

beforeAll(async () => {
  store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
  await store.migrate('auto');
  await createEffectTables(PG_URL, schema);
});
afterEach(() => killAllWorkers());
afterAll(async () => {
  await store?.close();
  await dropPgSchema(schema);
});

const silentLogger = { log: () => undefined, warn: () => undefined, error: () => undefined };

function producer(wakeUps: boolean): QueueProducerCore {
  const remote = wakeUps ? new RemoteWaker(store, 0, silentLogger) : null;
  return new QueueProducerCore(store, { maxPayloadBytes: 1024, maxAttemptsFor: () => 5 }, new WakeBus(), remote);
}

for (const wakeUps of [true, false]) {
  it(`a running job canceled from another process ends canceled, its deaf handler aborted (${wakeUps ? 'woken by NOTIFY' : 'by the next heartbeat'})`, async () => {
    const queue = `cancel-running-${wakeUps ? 'notify' : 'heartbeat'}`;
    const [jobId] = await enqueueKeys(store, queue, ['running-1']);
    const worker = await WorkerProcess.start({
      url: PG_URL,
      schema,
      queue,
      mode: 'hang',
      leaseMs: LEASE_MS,
      events: true,
    });
    await worker.next((m) => m.type === 'started' && m.jobId === jobId);

    const startedAt = Date.now();
    expect(await producer(wakeUps).cancel(jobId!, { reason: 'drill' })).toEqual({
      id: jobId,
      queue,
      outcome: 'canceling',
      state: 'leased',
    });
    const event = await worker.event('canceled', (m) => m.jobId === jobId, LEASE_MS);
    const tookMs = Date.now() - startedAt;
    expect(event).toMatchObject({ queue, jobId, reason: 'drill' });
    // A heartbeat goes out when a third of the lease is used; a wake-up asks at once.
    expect(tookMs).toBeLessThan(wakeUps ? LEASE_MS / 3 : LEASE_MS / 3 + LEASE_MS / 6 + 1_000);

    await waitFor(
      async () => (await store.getJob(jobId!))?.state,
      (state) => state === 'canceled',
      { what: 'the job to be canceled' },
    );
    const attempts = await store.getAttempts(jobId!);
    expect(attempts.map((a) => [a.outcome, a.error])).toEqual([
      ['canceled', `job ${jobId} in queue '${queue}' was canceled: drill`],
    ]);
    // The handler never returned: nothing else was recorded, and nothing claims the job again.
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect((await store.getJob(jobId!))!.state).toBe('canceled');
    expect(worker.received('started')).toHaveLength(1);
    worker.kill();
  }, 60_000);
}
