/**
 * Pausing a queue across processes (issue 23): three real worker processes drain one queue; this
 * test process (a fourth) pauses it. From the pause's commit no process claims a job of the
 * queue, the handlers running then finish, and a fourth worker that boots during the pause
 * claims nothing; after the resume every job is done exactly once. Times are the database's
 * (the pause row's paused_at, the claims' claimed_at, the handler starts' clock_timestamp()).
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../../helpers/databases.js';
import { effectsReport, enqueueKeys } from '../../helpers/drills.js';
import { waitFor } from '../../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';

const schema = uniqueSchema('pause');
const queue = 'paused-drill';
const JOBS = 240;
const MAX_POLL_MS = 300;
const HANDLER_MS = 100;
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

const worker = (workerId: string) =>
  WorkerProcess.start({
    url: PG_URL,
    schema,
    queue,
    workerId,
    minReaders: 1,
    maxReaders: 4,
    minPollMs: 20,
    maxPollMs: MAX_POLL_MS,
    handlerDelayMs: HANDLER_MS,
  });

async function doneCount(): Promise<number> {
  const [row] = await sql<{ n: number }>(
    PG_URL,
    `SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = $1 AND state = 'done'`,
    [queue],
  );
  return row!.n;
}

it('a pause from another process stops every worker claiming, lets running jobs finish, holds for a worker that boots later, and a resume drains the rest exactly once', async () => {
  await enqueueKeys(
    store,
    queue,
    Array.from({ length: JOBS }, (_, i) => `pause-${i}`),
  );
  const workers = await Promise.all(['w1', 'w2', 'w3'].map(worker));
  await waitFor(doneCount, (n) => n >= 30, { what: 'the first jobs to be done', timeoutMs: 30_000 });

  expect(await store.pauseQueue(queue, 'drill')).toBe(true);
  const pausedAt = (await store.listPausedQueues()).find((p) => p.queue === queue)!.pausedAt;

  // Running handlers finish and their completions are written: nothing stays leased.
  await waitFor(
    async () => (await store.stats(queue)).leased,
    (leased) => leased === 0,
    { what: 'the running jobs to finish', timeoutMs: 10_000 },
  );
  // A fourth worker boots while the queue is paused, then every worker has had several polls.
  const late = await worker('w4-late');
  await new Promise((resolve) => setTimeout(resolve, 4 * MAX_POLL_MS + 500));

  const [window] = await sql<{ claimed_after: number; started_late: number; by_late: number; done: number }>(
    PG_URL,
    `SELECT (SELECT count(*)::int FROM "${schema}".jobs
             WHERE queue = $1 AND claimed_at > $2::timestamptz + interval '1 second') AS claimed_after,
            (SELECT count(*)::int FROM "${schema}".runs WHERE at > $2::timestamptz + interval '1 second') AS started_late,
            (SELECT count(*)::int FROM "${schema}".jobs WHERE worker_id = 'w4-late') AS by_late,
            (SELECT count(*)::int FROM "${schema}".jobs WHERE state = 'done') AS done`,
    [queue, pausedAt],
  );
  // paused_at is the pause statement's start, a moment before its commit: a claim that began in
  // between did not see it yet. So: no claim later than a second after it, no handler start
  // later than a second after it (a job claimed just before may start a moment after), and the
  // late worker claimed nothing.
  expect(window).toMatchObject({ claimed_after: 0, started_late: 0, by_late: 0 });
  expect(window!.done).toBeLessThan(JOBS);
  const stats = await store.stats(queue);
  expect(stats).toMatchObject({ paused: true, leased: 0, ready: JOBS - window!.done });
  // While paused, nothing more gets done.
  expect(await doneCount()).toBe(window!.done);

  expect(await store.resumeQueue(queue)).toBe(true);
  await waitFor(doneCount, (n) => n === JOBS, { what: 'every job to be done after the resume', timeoutMs: 60_000 });
  const report = await effectsReport(PG_URL, schema);
  expect(report).toMatchObject({
    jobs: JOBS,
    done: JOBS,
    effects: JOBS,
    missingEffects: [],
    duplicateEffects: [],
    strayEffects: 0,
    runs: JOBS,
    jobsRunMoreThanOnce: 0,
  });
  // The worker that booted during the pause takes part once the queue is resumed.
  const [byLate] = await sql<{ n: number }>(
    PG_URL,
    `SELECT count(*)::int AS n FROM "${schema}".jobs WHERE worker_id = 'w4-late'`,
  );
  expect(byLate!.n).toBeGreaterThan(0);
  await Promise.all([...workers, late].map((w) => w.stop()));
}, 120_000);
