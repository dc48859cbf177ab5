import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PG_URL, sql } from '../helpers/databases.js';
import { attemptSummary } from '../helpers/drills.js';
import { createSpanTable, enqueueIds, groupJob } from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';
import { killAllWorkers, WorkerProcess } from '../helpers/worker-process.js';
import type { GroupWorkerConfig } from '../workers/group-worker.js';

/**
 * Ordered groups, proof 5 (issue 11): a worker process dies (SIGKILL) or freezes (SIGSTOP)
 * while it holds a group. Once its lease has run out and the reaper ran, another worker goes
 * on with the group from the same job, the jobs behind it in order; the frozen worker's late
 * completion is refused by its token and changes nothing.
 */
const db = migratedPgStore('grpcrash', 2);
const SHORT_LEASE_MS = 1_500;

beforeAll(() => createSpanTable(PG_URL, db.schema));
afterEach(() => killAllWorkers());
afterAll(() => killAllWorkers());

function worker(queue: string, workerId: string, options: Partial<GroupWorkerConfig> = {}): Promise<WorkerProcess> {
  const config: GroupWorkerConfig = {
    url: PG_URL,
    schema: db.schema,
    queue,
    workerId,
    minReaders: 1,
    maxReaders: 2,
    leaseMs: 10_000,
    reaperIntervalMs: 200,
    events: true,
    ...options,
  };
  return WorkerProcess.start(config, 'group-worker.js');
}

/** Handler runs of the queue in start order: job, worker process, attempt, ended or not. */
async function runs(queue: string) {
  return sql<{ job_id: string; pid: number; attempt: number; ended: boolean }>(
    PG_URL,
    `SELECT job_id::text AS job_id, pid, attempt, ended_at IS NOT NULL AS ended
     FROM "${db.schema}".spans WHERE queue = $1 ORDER BY started_at, span_id`,
    [queue],
  );
}

async function allDone(ids: readonly string[], what: string) {
  await waitFor(
    async () => (await Promise.all(ids.map((id) => db.store.getJob(id)))).map((j) => j?.state),
    (states) => states.every((s) => s === 'done'),
    { timeoutMs: 20_000, what },
  );
}

describe('a worker holding a group', () => {
  it('killed (SIGKILL) holding a group batch: after the lease expires another worker continues from the same job, in order', async () => {
    const queue = 'crash';
    const ids = await enqueueIds(
      db.store,
      Array.from({ length: 6 }, (_, n) => groupJob(queue, 'g', { n })),
    );
    // A leases the first three as one batch and hangs in the first.
    const a = await worker(queue, 'crash-A', { mode: 'hang', leaseMs: SHORT_LEASE_MS, groupBatchSize: 3 });
    await a.next((m) => m.type === 'started' && m.jobId === ids[0]);
    a.kill('SIGKILL');
    await a.exited;
    const orphans = await Promise.all(ids.slice(0, 3).map((id) => db.store.getJob(id)));
    expect(orphans.map((j) => [j!.state, j!.workerId])).toEqual(Array(3).fill(['leased', 'crash-A']));
    expect(new Set(orphans.map((j) => j!.claimToken)).size).toBe(1);

    const b = await worker(queue, 'crash-B');
    await allDone(ids, 'worker B to finish the group');
    // B began where A stopped, once A's lease had run out, and took every job in id order.
    const all = await runs(queue);
    expect(all.map((r) => [r.job_id, r.pid, r.ended])).toEqual([
      [ids[0], a.pid, false],
      ...ids.map((id) => [id, b.pid, true]),
    ]);
    const [first] = await sql<{ started_at: Date }>(
      PG_URL,
      `SELECT started_at FROM "${db.schema}".spans WHERE job_id = $1 AND pid = $2`,
      [ids[0], b.pid],
    );
    expect(first!.started_at.getTime()).toBeGreaterThanOrEqual(orphans[0]!.leaseUntil!.getTime());
    expect(attemptSummary(await db.store.getAttempts(ids[0]!))).toEqual([
      '1:lease-expired:crash-A',
      '2:completed:crash-B',
    ]);
    for (const id of ids.slice(3)) {
      expect(attemptSummary(await db.store.getAttempts(id))).toEqual(['1:completed:crash-B']);
    }
  });

  it('frozen (SIGSTOP) past its lease: another worker continues the group from the same job; the late completion is refused', async () => {
    const queue = 'frozen';
    const ids = await enqueueIds(
      db.store,
      Array.from({ length: 4 }, (_, n) => groupJob(queue, 'g', { n })),
    );
    const c = await worker(queue, 'frozen-C', { mode: 'gated', leaseMs: SHORT_LEASE_MS });
    await c.next((m) => m.type === 'started' && m.jobId === ids[0]);
    c.kill('SIGSTOP');

    const d = await worker(queue, 'frozen-D');
    await allDone(ids, 'worker D to finish the group');
    const settled = await db.store.getJob(ids[0]!);
    expect(settled).toMatchObject({ state: 'done', attempts: 2, workerId: 'frozen-D' });

    c.kill('SIGCONT');
    c.release(ids[0]!, 'complete');
    const outcome = await c.next(
      (m) =>
        m.type === 'event' &&
        m.jobId === ids[0] &&
        (m.name === 'completed' || (m.name === 'lostOwnership' && m.during === 'complete')),
      10_000,
    );
    expect(outcome).toMatchObject({ name: 'lostOwnership', during: 'complete', outcome: 'lost' });
    expect(await db.store.getJob(ids[0]!)).toEqual(settled);
    expect(attemptSummary(await db.store.getAttempts(ids[0]!))).toEqual([
      '1:lease-expired:frozen-C',
      '2:completed:frozen-D',
    ]);
    // D ran the group in id order, each job once; C ran only the first (its late run ended too).
    const all = await runs(queue);
    expect(all.filter((r) => r.pid === d.pid).map((r) => r.job_id)).toEqual(ids);
    expect(all.filter((r) => r.pid === c.pid).map((r) => r.job_id)).toEqual([ids[0]]);
  });
});
