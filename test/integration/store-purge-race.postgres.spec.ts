import pg from 'pg';
import { expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 1 };
const db = migratedPgStore('purge', 4);

async function deadJob(queue: string): Promise<string> {
  const [created] = await db.store.enqueue([prepareJob(queue, { x: 1 }, {}, LIMITS)]);
  const [claimed] = await db.store.claim({ queue, limit: 1, leaseMs: 30_000, workerId: 'w' });
  await db.store.fail([
    {
      id: claimed!.id,
      claimToken: claimed!.claimToken,
      error: 'boom',
      stack: null,
      retryDelayMs: 0,
      dead: true,
      workerId: 'w',
    },
  ]);
  expect((await db.store.getJob(created!.jobId))?.state).toBe('dead');
  return created!.jobId;
}

/** Statements of this schema waiting on a row lock. */
async function lockWaiters(): Promise<string[]> {
  const rows = await sql<{ query: string }>(
    PG_URL,
    `SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
    [`%${db.schema}%`],
  );
  return rows.map((r) => r.query);
}

/**
 * Interleaving: retryDead's UPDATE is queued on the row first, purge/cleanup's DELETE second
 * (its subquery sees the row dead). A third session's short row lock only lines them up.
 */
async function raceRetryWith(
  queue: string,
  jobId: string,
  remover: () => Promise<number>,
): Promise<{ retried: string[] }> {
  const holder = new pg.Client({ connectionString: PG_URL });
  await holder.connect();
  try {
    await holder.query('BEGIN');
    await holder.query(`SELECT 1 FROM "${db.schema}".jobs WHERE id = $1 FOR UPDATE`, [jobId]);
    const retry = db.store.retryDead(queue, [jobId]);
    await waitFor(lockWaiters, (w) => w.some((q) => q.startsWith('UPDATE')), { what: 'retryDead to wait' });
    let removed = false;
    const removal = remover().finally(() => (removed = true));
    // The DELETE either waits on the row (cleanup re-checks after the wait) or skips it and
    // finishes (purgeDead locks with SKIP LOCKED): either way it has met the row lock.
    await waitFor(async () => removed || (await lockWaiters()).some((q) => q.startsWith('DELETE')), Boolean, {
      what: 'the delete to wait on the row or to finish',
    });
    await holder.query('COMMIT');
    const [retried] = await Promise.all([retry, removal]);
    return { retried };
  } finally {
    await holder.end();
  }
}

it('purgeDead racing retryDead: a job retryDead reported as moved back to ready is not deleted', async () => {
  const jobId = await deadJob('purge');
  const { retried } = await raceRetryWith('purge', jobId, () => db.store.purgeDead('purge'));
  expect(retried).toEqual([jobId]);
  expect(await db.store.getJob(jobId)).toMatchObject({ state: 'ready' });
});

it('retention cleanup racing retryDead: a retried job is not deleted as an old dead one', async () => {
  const jobId = await deadJob('cleanup');
  await sql(PG_URL, `UPDATE "${db.schema}".jobs SET finished_at = now() - interval '1 day' WHERE id = $1`, [jobId]);
  const { retried } = await raceRetryWith('cleanup', jobId, () =>
    db.store.cleanup({
      doneRetentionMs: 3_600_000,
      idempotencyRetentionMs: 3_600_000,
      deadRetentionMs: 3_600_000,
      batchSize: 100,
    }),
  );
  expect(retried).toEqual([jobId]);
  expect(await db.store.getJob(jobId)).toMatchObject({ state: 'ready' });
});
