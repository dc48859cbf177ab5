/**
 * What flow control's T-SQL (issue 24, queries/flow.queries.ts) assumes about SQL Server, one
 * experiment each, so the first run on a real server says which assumption broke. Every statement
 * passes the grammar gate in `npm test`; none of these has run on a server yet.
 *
 * - flow-lock: a transaction holding the queue's FlowState row WITH (UPDLOCK, ROWLOCK) makes a
 *   flow claim wait (not skip) until it commits, and the claim then counts what that transaction
 *   leased: under READ_COMMITTED_SNAPSHOT each statement's snapshot starts after the lock was
 *   granted; under locking READ COMMITTED the count waits for the writer.
 * - first-row: concurrent first flow claims of a new queue make its FlowState row once, none
 *   fails on the primary key (the TRY/CATCH of 2601/2627).
 * - starts: the starts a rate-limited claim records are its leases' ClaimedAt, to the millisecond,
 *   and a claim's @leaseAt is never before the database clock it read for the window.
 * - negative room: limits lowered below what runs now (room < 0) lease nothing and raise nothing
 *   (TOP refuses a negative count; the claim clamps it).
 * - walk plan: over 5,000 keys with ready jobs, a claim of 10 reads a few dozen entries of
 *   IX_Jobs_KeyReady (one seek per key it looks at), not the index.
 */
import sql from 'mssql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ClaimedJob, FlowLimits } from '../../../lib/src/core/types.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { mssqlRows, openMssqlPool } from '../../helpers/mssql.js';
import { VIEW_SERVER_STATE } from '../../helpers/mssql-test-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';
import { closePlanPools, replayWithShowplans, rowsReadByIndex, statementRecorder } from './plan-replay.js';

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 5 };
const NONE: FlowLimits = { globalConcurrency: null, concurrencyPerKey: null, rateLimit: null, rateLimitPerKey: null };

describeEachMssqlDatabase('flow control: what its T-SQL assumes about SQL Server', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'flowfacts', 8);
  let admin: sql.ConnectionPool;
  beforeAll(async () => {
    admin = await openMssqlPool(db.url, 4);
  });
  afterAll(async () => {
    await admin?.close();
  });

  async function limitedQueue(label: string, limits: Partial<FlowLimits>): Promise<string> {
    const queue = newQueue(label);
    await store.recordQueueSettings([{ queue, maxAttempts: 5, limits: { ...NONE, ...limits } }]);
    return queue;
  }

  const enqueue = (queue: string, count: number, concurrencyKey?: string) =>
    store.enqueue(
      Array.from({ length: count }, (_, n) =>
        prepareJob(queue, { n }, concurrencyKey === undefined ? {} : { concurrencyKey }, LIMITS),
      ),
    );

  const claim = (queue: string, limit: number, on: QueueStore = store) =>
    on.claim({ queue, limit, leaseMs: 60_000, workerId: 'flowfacts', limited: true });

  async function keysOf(ids: readonly string[]): Promise<string[]> {
    return (await Promise.all(ids.map(async (id) => (await store.getJob(id))!.concurrencyKey!))).sort();
  }

  it('flow-lock: a claim waits for the transaction holding the FlowState row, then counts the leases it committed', async () => {
    const queue = await limitedQueue('flow-lock', { concurrencyPerKey: 2 });
    await enqueue(queue, 2, 'held');
    await enqueue(queue, 2, 'free');
    expect(await claim(queue, 0)).toEqual([]); // makes the queue's FlowState row

    const holder = new sql.Transaction(admin);
    await holder.begin();
    let waiting: Promise<ClaimedJob[]> | undefined;
    try {
      const q = (r: sql.Request) => r.input('queue', sql.NVarChar(128), queue);
      const locked = await q(new sql.Request(holder)).query(
        `SELECT [CursorKey] FROM [${schema}].[FlowState] WITH (UPDLOCK, ROWLOCK) WHERE [Queue] = @queue AND [Lane] = N''`,
      );
      expect(locked.recordset).toHaveLength(1);
      // What a concurrent flow claim would lease under the lock: both jobs of key 'held'.
      const leased = await q(new sql.Request(holder)).query(
        `UPDATE [${schema}].[Jobs] WITH (ROWLOCK)
         SET [State] = 'leased', [ClaimToken] = NEWID(), [Attempts] = [Attempts] + 1, [ClaimedAt] = SYSUTCDATETIME(),
             [LeaseUntil] = DATEADD(minute, 1, SYSUTCDATETIME()), [WorkerId] = N'holder'
         WHERE [Queue] = @queue AND [State] = 'ready' AND [ConcurrencyKey] = N'held'`,
      );
      expect(leased.rowsAffected[0]).toBe(2);
      let settled = false;
      waiting = claim(queue, 10).then((jobs) => {
        settled = true;
        return jobs;
      });
      // Seen waiting on the holder's session (another session's request needs VIEW SERVER STATE;
      // without it, a claim that has not returned after a second stands for it).
      const [spid] = (await new sql.Request(holder).query<{ Spid: number }>('SELECT @@SPID AS [Spid];')).recordset;
      const [permission] = await mssqlRows<{ Granted: number | null }>(db.url, VIEW_SERVER_STATE);
      if (permission?.Granted === 1) {
        await waitFor(
          async () =>
            (
              await admin
                .request()
                .input('spid', sql.Int, spid!.Spid)
                .query<{ n: number }>(
                  "SELECT COUNT(*) AS n FROM sys.dm_exec_requests WHERE [blocking_session_id] = @spid AND [wait_type] LIKE N'LCK_M_%'",
                )
            ).recordset[0]!.n,
          (n) => n > 0 || settled,
          { what: "the flow claim to wait on the holder's FlowState lock" },
        );
      } else {
        await new Promise((resolve) => setTimeout(resolve, 1_000));
      }
      expect(settled, 'the claim went on without waiting for the FlowState row').toBe(false);
      await holder.commit();
    } catch (error) {
      await holder.rollback().catch(() => undefined);
      throw error;
    }
    const claimed = await waiting!;
    expect(await keysOf(claimed.map((job) => job.id)), 'the claim counted the leases committed under the lock').toEqual(
      ['free', 'free'],
    );
  });

  it('first-row: eight concurrent first claims of a new queue make one FlowState row, and none fails', async () => {
    const queue = await limitedQueue('first-row', { globalConcurrency: 100 });
    await enqueue(queue, 16);
    const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => claim(queue, 2)));
    expect(
      outcomes.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason)),
    ).toEqual([]);
    const claimed = outcomes.flatMap((o) => (o.status === 'fulfilled' ? o.value : []));
    expect(new Set(claimed.map((job) => job.id)).size).toBe(16);
    const rows = await admin
      .request()
      .input('queue', sql.NVarChar(128), queue)
      .query<{ n: number }>(`SELECT COUNT(*) AS n FROM [${schema}].[FlowState] WHERE [Queue] = @queue`);
    expect(rows.recordset[0]!.n).toBe(1);
  });

  it("starts: the starts a rate-limited claim records are its leases' ClaimedAt, whole milliseconds", async () => {
    const queue = await limitedQueue('starts', {
      rateLimit: { max: 100, perMs: 60_000 },
      rateLimitPerKey: { max: 100, perMs: 60_000 },
    });
    await enqueue(queue, 3);
    await enqueue(queue, 3, 'k');
    const claimed = await claim(queue, 10);
    expect(claimed).toHaveLength(6);
    const starts = await admin
      .request()
      .input('queue', sql.NVarChar(128), queue)
      .query<{ Lane: string; At: Date }>(
        `SELECT [Lane], [At] FROM [${schema}].[FlowStarts] WHERE [Queue] = @queue ORDER BY [Lane], [At]`,
      );
    const claimedAt = claimed.map((job) => job.claimedAt.getTime()).sort();
    // Every start in the queue's window, the keyed ones in their key's as well.
    expect(starts.recordset.filter((s) => s.Lane === '').map((s) => s.At.getTime())).toEqual(claimedAt);
    expect(starts.recordset.filter((s) => s.Lane === 'k')).toHaveLength(3);
    const usage = await store.flowUsage!(queue, 10);
    expect(usage.windowStarts).toBe(6);
  });

  it('negative room: limits lowered below what runs now lease nothing and raise nothing', async () => {
    const queue = await limitedQueue('negative', { globalConcurrency: 5, concurrencyPerKey: 5 });
    await enqueue(queue, 10, 'k');
    expect(await claim(queue, 10)).toHaveLength(5);
    await store.recordQueueSettings([
      { queue, maxAttempts: 5, limits: { ...NONE, globalConcurrency: 2, concurrencyPerKey: 1 } },
    ]);
    expect(await claim(queue, 10)).toEqual([]);
  });

  it('walk plan: over 5,000 keys, a claim of 10 reads a few dozen entries of IX_Jobs_KeyReady', async () => {
    const queue = await limitedQueue('walk-plan', { concurrencyPerKey: 1 });
    for (let from = 0; from < 5_000; from += 1_000) {
      await store.enqueue(
        Array.from({ length: 2_000 }, (_, n) =>
          prepareJob(queue, { n }, { concurrencyKey: `key-${String(from + (n >> 1)).padStart(5, '0')}` }, LIMITS),
        ),
      );
    }
    const pool = await openMssqlPool(db.url, 2);
    const planPool = await openMssqlPool(db.url, 1);
    const planned = createMssqlStore({ pool }, { schema });
    try {
      const capture = statementRecorder(pool);
      const recordsets = await replayWithShowplans(capture, planPool, () => claim(queue, 10, planned));
      const read = rowsReadByIndex(recordsets, schema, 'Jobs');
      expect(read.get('IX_Jobs_KeyReady') ?? 0, JSON.stringify([...read])).toBeGreaterThan(0);
      expect(read.get('IX_Jobs_KeyReady')!, JSON.stringify([...read])).toBeLessThan(200);
      expect(read.get('PK_Jobs') ?? 0, JSON.stringify([...read])).toBeLessThan(50);
    } finally {
      await closePlanPools({ planPool, store: planned, pool });
    }
  });
});
