import { afterAll, beforeAll, expect, it } from 'vitest';
import { PG_URL, sql } from '../helpers/databases.js';
import {
  createSpanTable,
  enqueueIds,
  groupDisagreements,
  groupJob,
  spanTotals,
  spanViolations,
} from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';
import { killAllWorkers, WorkerProcess } from '../helpers/worker-process.js';
import type { GroupWorkerConfig } from '../workers/group-worker.js';

/**
 * Ordered groups, proof 1 (issue 11): 50 groups × 200 jobs drained by 8 readers in 2 worker
 * processes (test/workers/group-worker.ts). Each handler run is recorded with its start and end
 * (the workers' clock, written when they stop, so recording does not slow the drain). Per group
 * the runs follow id order and never overlap; the groups run in parallel (the drain takes well
 * under the sum of the runs); every job runs exactly once.
 */
const db = migratedPgStore('grppar', 2);
const GROUPS = 50;
const PER_GROUP = 200;
const QUEUE = 'parallel';

beforeAll(() => createSpanTable(PG_URL, db.schema));
afterAll(() => killAllWorkers());

it(`${GROUPS} groups × ${PER_GROUP} jobs, 8 readers in 2 processes: in order per group, no overlap, in parallel, each once`, async () => {
  // Interleaved, as producers of many groups would write them.
  const jobs = Array.from({ length: PER_GROUP * GROUPS }, (_, n) => groupJob(QUEUE, `group-${n % GROUPS}`, { n }));
  const ids = await enqueueIds(db.store, jobs);
  expect(ids).toHaveLength(GROUPS * PER_GROUP);
  const config: GroupWorkerConfig = {
    url: PG_URL,
    schema: db.schema,
    queue: QUEUE,
    minReaders: 4,
    maxReaders: 4,
    leaseMs: 30_000,
    // Work that takes time, so that the sum of the runs means something.
    handlerDelayMs: 2,
    report: false,
    spans: 'at-stop',
  };
  const workers = await Promise.all([
    WorkerProcess.start({ ...config, workerId: 'parallel-A' } as GroupWorkerConfig, 'group-worker.js'),
    WorkerProcess.start({ ...config, workerId: 'parallel-B' } as GroupWorkerConfig, 'group-worker.js'),
  ]);
  await waitFor(
    () => db.store.stats(QUEUE),
    (s) => s.ready + s.delayed + s.leased === 0,
    { timeoutMs: 120_000, intervalMs: 250, what: 'the queue to drain' },
  );
  await Promise.all(workers.map((w) => w.stop()));

  const [states] = await sql<{ done: number; other: number }>(
    PG_URL,
    `SELECT count(*) FILTER (WHERE state = 'done')::int AS done, count(*) FILTER (WHERE state <> 'done')::int AS other
     FROM "${db.schema}".jobs WHERE queue = $1`,
    [QUEUE],
  );
  expect(states).toEqual({ done: GROUPS * PER_GROUP, other: 0 });
  const totals = await spanTotals(PG_URL, db.schema, QUEUE);
  // One run per job: nothing lost, nothing run twice.
  expect({ spans: totals.spans, jobs: totals.jobs }).toEqual({ spans: GROUPS * PER_GROUP, jobs: GROUPS * PER_GROUP });
  expect(await spanViolations(PG_URL, db.schema, QUEUE)).toEqual([]);
  // Both processes took part, and the groups overlapped in time: one reader would have needed
  // the sum of the runs.
  const [pids] = await sql<{ n: number }>(
    PG_URL,
    `SELECT count(DISTINCT pid)::int AS n FROM "${db.schema}".spans WHERE queue = $1`,
    [QUEUE],
  );
  expect(pids!.n).toBe(2);
  expect(
    totals.wallMs,
    `drain ${Math.round(totals.wallMs)} ms against ${Math.round(totals.serialMs)} ms of handler time`,
  ).toBeLessThan(totals.serialMs / 2);
  expect(await groupDisagreements(PG_URL, db.schema, { queue: QUEUE })).toEqual([]);
}, 180_000);
