/**
 * What transactional handlers' T-SQL (issue 25: completeInTransaction, run in the handler's
 * mssql Transaction) assumes about SQL Server, one experiment each, so the first run on a real
 * server says which assumption broke. The statement passes the grammar gate in `npm test`; none
 * of these has run on a server yet.
 *
 * - A: completeInTransaction opens no transaction of its own: a rollback of the handler's
 *   transaction after it leaves the job leased to its owner.
 * - B: the session options it sets (NOCOUNT, DEADLOCK_PRIORITY LOW) revert when its
 *   sp_executesql batch ends: the handler's next statements in the same transaction run at the
 *   session's own deadlock priority.
 * - C: the completed row stays locked until the handler's transaction commits: a READPAST read
 *   (what claims and listings do) passes over it, and a locking read after the commit sees it done.
 * - D: a nested BEGIN TRANSACTION the handler left open (@@TRANCOUNT 2) makes it refuse to run
 *   (51005), rather than complete into a transaction whose commit would commit nothing.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { SqlQueueTransactionError } from '../../../lib/src/core/errors.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { mssqlRows } from '../../helpers/mssql.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 5 };

describeEachMssqlDatabase('transactional handlers: what their T-SQL assumes about SQL Server', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'txfacts', 4);

  async function claimOne() {
    const queue = newQueue('txfacts');
    await store.enqueue([prepareJob(queue, { n: 1 }, {}, LIMITS)]);
    const [job] = await store.claim({ queue, limit: 1, leaseMs: 60_000, workerId: 'txfacts' });
    return job!;
  }

  it('fact A: a rollback after completeInTransaction leaves the job leased to its owner', async () => {
    const job = await claimOne();
    const transaction = await store.beginHandlerTransaction!();
    expect((await transaction.complete({ id: job.id, claimToken: job.claimToken })).outcome).toBe('ok');
    await transaction.rollback();
    expect(await store.getJob(job.id)).toMatchObject({ state: 'leased', claimToken: job.claimToken });
  });

  it("fact B: its SET options revert when its batch ends: the transaction's next statement runs at normal deadlock priority", async () => {
    const job = await claimOne();
    const transaction = await store.beginHandlerTransaction!();
    try {
      await transaction.complete({ id: job.id, claimToken: job.claimToken });
      const { recordset } = await new sql.Request(transaction.handle as sql.Transaction).query<{ Priority: number }>(
        'SELECT [deadlock_priority] AS [Priority] FROM sys.dm_exec_sessions WHERE [session_id] = @@SPID;',
      );
      expect(recordset[0]!.Priority).toBe(0);
    } finally {
      await transaction.rollback();
    }
  });

  it('fact C: the completed row stays locked to the commit: READPAST passes over it, the commit then shows it done', async () => {
    const job = await claimOne();
    const transaction = await store.beginHandlerTransaction!();
    await transaction.complete({ id: job.id, claimToken: job.claimToken });
    const skipped = await mssqlRows<{ n: number }>(
      db.url,
      `SELECT COUNT(*) AS n FROM [${schema}].[Jobs] WITH (READPAST, READCOMMITTEDLOCK) WHERE [Id] = @id`,
      (r) => r.input('id', sql.BigInt, job.id),
    );
    expect(skipped[0]!.n).toBe(0);
    await transaction.commit();
    expect(await store.getJob(job.id)).toMatchObject({ state: 'done' });
  });

  it('fact D: a nested transaction left open makes the completion refuse to run (51005)', async () => {
    const job = await claimOne();
    const transaction = await store.beginHandlerTransaction!();
    try {
      await new sql.Request(transaction.handle as sql.Transaction).batch('BEGIN TRANSACTION;');
      await expect(transaction.complete({ id: job.id, claimToken: job.claimToken })).rejects.toThrow(
        SqlQueueTransactionError,
      );
    } finally {
      await transaction.rollback();
    }
    expect(await store.getJob(job.id)).toMatchObject({ state: 'leased' });
  });
});
