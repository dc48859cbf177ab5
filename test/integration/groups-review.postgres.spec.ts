import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { PG_URL } from '../helpers/databases.js';
import { enqueueIds, groupJob, idsOf, owned } from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';
import { pgQueries } from '../../lib/src/store/postgres/postgres.queries.js';
import { withTimeout } from '../../lib/src/core/timeout.js';

/**
 * Regressions from the review of ordered groups on PostgreSQL: interleavings of producers,
 * completions and the reaper that once left a group unable to go on.
 */
const db = migratedPgStore('grprev', 4);
const claim = (queue: string, limit = 10, groupBatchSize = 1) =>
  db.store.claim({ queue, limit, leaseMs: 60_000, workerId: 'review', groupBatchSize });

async function openClient(): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  return client;
}

describe('ordered groups after review', () => {
  it('a lower id that commits after a completion chose a later head runs next; the group never stalls', async () => {
    const queue = 'rev.late-lower';
    const [h1] = await enqueueIds(db.store, [groupJob(queue, 'g')]);
    const first = await claim(queue);
    expect(idsOf(first)).toEqual([h1]);
    const producer = await openClient();
    try {
      await producer.query('BEGIN');
      const [late] = await enqueueIds(db.store, [groupJob(queue, 'g')], producer); // held group: head unchanged
      const [h2] = await enqueueIds(db.store, [groupJob(queue, 'g')]); // a higher id, committed
      expect(BigInt(h2!) > BigInt(late!)).toBe(true);
      await db.store.complete(owned(first)); // its snapshot cannot see `late`: the head becomes h2
      await producer.query('COMMIT');
      const next = await waitFor(
        () => claim(queue),
        (c) => c.length > 0,
        { timeoutMs: 5_000, what: 'the next job' },
      );
      expect(idsOf(next)).toEqual([late]);
      await db.store.complete(owned(next));
      const after = await waitFor(
        () => claim(queue),
        (c) => c.length > 0,
        { timeoutMs: 5_000, what: 'h2' },
      );
      expect(idsOf(after)).toEqual([h2]);
    } finally {
      await producer.end();
    }
  });

  it('the reaper racing the completion of a batch sibling leaves the group free, not held by a void token', async () => {
    const queue = 'rev.reap-race';
    const ids = await enqueueIds(db.store, [groupJob(queue, 'g'), groupJob(queue, 'g'), groupJob(queue, 'g')]);
    const batch = await claim(queue, 1, 2);
    expect(idsOf(batch)).toEqual(ids.slice(0, 2));
    const admin = await openClient();
    const worker = await openClient();
    try {
      // Both leases ran out (a frozen worker), whose completion of the first job is mid-statement.
      await admin.query(
        `UPDATE "${db.schema}".jobs SET lease_until = now() - interval '1 minute' WHERE queue = $1 AND state = 'leased'`,
        [queue],
      );
      await worker.query('BEGIN');
      await worker.query(pgQueries(db.schema).complete, [
        JSON.stringify([{ id: batch[0]!.id, token: batch[0]!.claimToken }]),
      ]);
      const reaping = db.store.reap(100); // skips the locked first job, reaps the second, waits on the first
      await waitFor(
        async () =>
          (
            await admin.query(
              `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`,
            )
          ).rows[0].n,
        (waiting: number) => waiting > 0,
        { timeoutMs: 5_000, what: 'the reaper to wait on the completion' },
      );
      await worker.query('COMMIT');
      await reaping;
      const next = await waitFor(
        () => claim(queue, 1, 2),
        (c) => c.length > 0,
        { timeoutMs: 5_000, what: 'the group to go on' },
      );
      expect(idsOf(next)).toEqual(ids.slice(1));
    } finally {
      await worker.end();
      await admin.end();
    }
  });

  it('a producer holding an emptied group does not hold the store: settling waits without a connection', async () => {
    const queue = 'rev.settle';
    const keys = ['a', 'b', 'c', 'd'];
    const heads = await enqueueIds(
      db.store,
      keys.map((key) => groupJob(queue, key)),
    );
    const running = await claim(queue);
    expect(running).toHaveLength(4);
    const producer = await openClient();
    try {
      await producer.query('BEGIN');
      const added = await enqueueIds(
        db.store,
        keys.map((key) => groupJob(queue, key, { late: true })),
        producer,
      );
      await db.store.complete(owned(running)); // every group emptied while the producer holds it
      // The pool (4 connections) stays usable while the producer's transaction is open.
      // (Bounded well under the 5 s a pooled connection once waited per group for the producer.)
      for (let i = 0; i < 6; i++) await withTimeout(db.store.stats(queue), 2_500, 'stats');
      expect(await claim(queue)).toEqual([]);
      await producer.query('COMMIT');
      const next = await waitFor(
        () => claim(queue),
        (c) => c.length === 4,
        { timeoutMs: 10_000, what: 'the four late jobs' },
      );
      expect(idsOf(next).sort()).toEqual([...added].sort());
      expect(heads).toHaveLength(4);
    } finally {
      await producer.end();
    }
  });
});
