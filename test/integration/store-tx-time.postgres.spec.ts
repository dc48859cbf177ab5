import pg from 'pg';
import { expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { PG_URL } from '../helpers/databases.js';
import { migratedPgStore } from '../helpers/pg-store.js';

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 3 };
const db = migratedPgStore('txtime', 2);

/** A business transaction that has been open a while (here 3 s) before it enqueues. */
async function enqueueLateInTransaction(jobs: ReturnType<typeof prepareJob>[]): Promise<void> {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  try {
    await client.query('BEGIN');
    await client.query('SELECT pg_sleep(3)');
    await db.store.enqueue(jobs, client);
    await client.query('COMMIT');
  } finally {
    await client.end();
  }
}

it('delayMs in a caller transaction counts from the enqueue, not from BEGIN (single job)', async () => {
  await enqueueLateInTransaction([prepareJob('one', { x: 1 }, { delayMs: 2_500 }, LIMITS)]);
  // Committed just now with a 2.5 s delay: it must not be claimable yet.
  expect(await db.store.claim({ queue: 'one', limit: 1, leaseMs: 30_000, workerId: 'w' })).toEqual([]);
});

it('delayMs in a caller transaction counts from the enqueue, not from BEGIN (bulk)', async () => {
  await enqueueLateInTransaction([
    prepareJob('bulk', { x: 1 }, { delayMs: 2_500 }, LIMITS),
    prepareJob('bulk', { x: 2 }, { delayMs: 2_500 }, LIMITS),
  ]);
  expect(await db.store.claim({ queue: 'bulk', limit: 2, leaseMs: 30_000, workerId: 'w' })).toEqual([]);
});
