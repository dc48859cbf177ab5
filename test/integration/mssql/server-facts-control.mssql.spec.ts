/**
 * What job control's T-SQL (issue 23) assumes about SQL Server, one experiment each, so the first
 * run on a real server says which assumption broke. Every statement passes the grammar gate in
 * `npm test`; none of these has run on a server yet.
 *
 * - A: assigning to a parameter of the sp_executesql batch (the claim's
 *   `SET @limit = CASE WHEN <paused> THEN 0 ELSE @limit END`) takes effect for the rest of the
 *   batch: TOP (@limit) then takes 0 rows.
 * - B: `INSERT … OUTPUT … SELECT … WHERE NOT EXISTS (… WITH (UPDLOCK, HOLDLOCK))` (pauseQueue)
 *   serializes concurrent pauses of one queue: exactly one inserts, none fails on the primary key.
 * - C: the claim reads QueuePauses with READPAST: a pause not committed yet neither blocks a claim
 *   nor stops it; once committed, the claim leases nothing.
 * - D: a Jobs row with every variable column at its longest, CancelReason and Progress included,
 *   is still stored (the row stays within 8,060 bytes in-row).
 */
import sql from 'mssql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { openMssqlPool } from '../../helpers/mssql.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 5 };

describeEachMssqlDatabase('job control: what its T-SQL assumes about SQL Server', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'ctlfacts', 4);
  let admin: sql.ConnectionPool;
  beforeAll(async () => {
    admin = await openMssqlPool(db.url, 4);
  });
  afterAll(async () => {
    await admin?.close();
  });

  it('fact A: a SET on an sp_executesql parameter holds for the rest of the batch (TOP (@limit) takes 0 rows)', async () => {
    const result = await admin
      .request()
      .input('limit', sql.Int, 5)
      .query<{ name: string }>('SET @limit = 0; SELECT TOP (@limit) name FROM sys.objects;');
    expect(result.recordset).toEqual([]);
  });

  it('fact B: eight concurrent pauses of one queue: exactly one inserts, none fails', async () => {
    const queue = newQueue('pause-race');
    const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => store.pauseQueue(queue, 'race')));
    const errors = outcomes
      .filter((o) => o.status === 'rejected')
      .map((o) => String((o as PromiseRejectedResult).reason));
    expect(errors).toEqual([]);
    expect(outcomes.filter((o) => o.status === 'fulfilled' && o.value === true)).toHaveLength(1);
    expect((await store.listPausedQueues()).filter((p) => p.queue === queue)).toHaveLength(1);
  });

  it('fact C: an uncommitted pause neither blocks nor stops a claim (READPAST); a committed one stops it', async () => {
    const queue = newQueue('pause-readpast');
    await store.enqueue([prepareJob(queue, { n: 1 }, {}, LIMITS), prepareJob(queue, { n: 2 }, {}, LIMITS)]);
    const open = new sql.Transaction(admin);
    await open.begin();
    try {
      await new sql.Request(open)
        .input('queue', sql.NVarChar(128), queue)
        .query(`INSERT INTO [${schema}].[QueuePauses] ([Queue], [Reason]) VALUES (@queue, N'uncommitted')`);
      const startedAt = Date.now();
      const claimed = await store.claim({ queue, limit: 1, leaseMs: 30_000, workerId: 'facts' });
      expect(Date.now() - startedAt, 'the claim waited on the uncommitted pause').toBeLessThan(2_000);
      expect(claimed).toHaveLength(1);
      await open.commit();
    } catch (error) {
      await open.rollback().catch(() => undefined);
      throw error;
    }
    expect(await store.claim({ queue, limit: 1, leaseMs: 30_000, workerId: 'facts' })).toEqual([]);
    await store.resumeQueue(queue);
  });

  it('fact D: a job with every variable column at its longest, a 1,000-character cancel reason and progress included, is stored', async () => {
    const queue = newQueue('x'.repeat(100));
    const key = 'k'.repeat(255);
    const [enqueued] = await store.enqueue([
      {
        ...prepareJob(queue, { n: 1 }, { idempotencyKey: key, groupKey: 'g'.repeat(255) }, LIMITS),
        traceContext: 't'.repeat(2048),
      },
    ]);
    const [claimed] = await store.claim({ queue, limit: 1, leaseMs: 30_000, workerId: 'w'.repeat(255) });
    await store.heartbeat([
      {
        id: claimed!.id,
        claimToken: claimed!.claimToken,
        leaseMs: 30_000,
        maxDurationMs: null,
        progress: JSON.stringify({ p: 'p'.repeat(4000) }),
      },
    ]);
    expect((await store.cancel([enqueued!.jobId], 'r'.repeat(1000)))[0]!.outcome).toBe('canceling');
    expect(await store.getJob(enqueued!.jobId)).toMatchObject({
      cancelReason: 'r'.repeat(1000),
      progress: { p: 'p'.repeat(4000) },
    });
  });
});
