// The session guards and options every T-SQL batch of the store opens with, and the wrapper of
// statements that must commit together.
/** THROW number of the session guard: the store's connection has an open transaction. */
export const MSSQL_OPEN_TRANSACTION = 51001;

/**
 * Session state every batch relies on, safe to set inside a caller's transaction too. The
 * driver never resets a pooled connection (mssql has no reset call), so a shared pool can hand
 * over a connection with an application's settings still on:
 * - NOCOUNT ON: no DONE_IN_PROC row count per statement (one per queue in queueHealth's loop);
 *   @@ROWCOUNT is still updated ("The @@ROWCOUNT function is updated even when SET NOCOUNT is
 *   ON", https://learn.microsoft.com/sql/t-sql/statements/set-nocount-transact-sql).
 * - IMPLICIT_TRANSACTIONS OFF: when ON, the first UPDATE of complete() would open a transaction
 *   left open after the call, and BEGIN TRANSACTION is itself preceded by "an unseen BEGIN
 *   TRANSACTION", so COMMIT would leave @@TRANCOUNT at 1
 *   (https://learn.microsoft.com/sql/t-sql/statements/set-implicit-transactions-transact-sql).
 *   Turning it off does not end a transaction that is already open.
 * - ROWCOUNT 0: a leftover SET ROWCOUNT n "causes most Transact-SQL statements to stop
 *   processing when they have been affected by the specified number of rows", so it would cap
 *   UPDATEs (valid tokens reported lost) and the result SELECTs
 *   (https://learn.microsoft.com/sql/t-sql/statements/set-rowcount-transact-sql).
 * Every statement runs through mssql's request.query(), which tedious always sends as
 * sp_executesql, and "if a SET statement is specified in a dynamic SQL string that is run by
 * using either sp_executesql or EXECUTE, the value of the SET option is restored after control
 * is returned from the batch" (https://learn.microsoft.com/sql/t-sql/statements/set-statements-transact-sql):
 * the application's own settings on a shared pool survive.
 */
export const SESSION_SETTINGS = `SET NOCOUNT ON;
SET IMPLICIT_TRANSACTIONS OFF;
SET ROWCOUNT 0;
`;

/** The guard's THROW (after an IF on @@TRANCOUNT) when the store's own connection has an open transaction. */
export const OPEN_TRANSACTION_THROW = `  THROW ${MSSQL_OPEN_TRANSACTION}, N'nestjs-sql-queue: the store runs this statement in autocommit mode, but its connection has an open transaction', 1;
`;

/**
 * Opens every batch the store runs on its own pooled connections: everything but enqueue, which
 * may run in the caller's transaction. None of these may run inside a transaction: their locks
 * (READPAST claims, U locks of the reaper) must end with the statement, and an UPDATE joined to
 * a transaction an application left open on a shared pool would never commit. So the guard
 * refuses an open transaction rather than joining it (the seed's claim guard, for every batch).
 * READ COMMITTED: a pooled connection keeps the isolation level its last transaction set (or
 * connectionIsolationLevel), and at SNAPSHOT or SERIALIZABLE every READPAST fails with error
 * 650 and update conflicts raise instead of reporting lost ownership. Set inside sp_executesql,
 * it reverts when the batch ends, like the SET options above.
 * DEADLOCK_PRIORITY LOW: in a deadlock with an application's session (a producer's transaction
 * holds its new jobs and group rows, or keys an idempotent enqueue waits on), the store's
 * statement is the victim: "the current session will be the deadlock victim if ... other
 * sessions involved in the deadlock chain have deadlock priority set to either NORMAL or HIGH"
 * (https://learn.microsoft.com/sql/t-sql/statements/set-deadlock-priority-transact-sql). The
 * store runs its statement again (run(), each is safe to repeat); the caller's transaction is
 * the caller's to redo, so it should not be the one rolled back.
 */
export const MSSQL_STORE_SESSION = `IF @@TRANCOUNT <> 0
${OPEN_TRANSACTION_THROW}${SESSION_SETTINGS}SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
SET DEADLOCK_PRIORITY LOW;
`;

/**
 * MSSQL_STORE_SESSION without the isolation level and deadlock priority: the guard and session
 * options for autocommit batches of another part on the store's pool (the Service Broker
 * transport's health, setup and figures, review 2 R2-6), which set those two themselves where
 * they matter. A shared pool may hand such a batch a connection an application left with
 * IMPLICIT_TRANSACTIONS ON: its first write or table read would open a transaction nobody
 * commits, holding its locks and breaking the store's next statement on that connection.
 */
export const MSSQL_AUTOCOMMIT_SESSION = `IF @@TRANCOUNT <> 0
${OPEN_TRANSACTION_THROW}${SESSION_SETTINGS}`;

/** THROW number of the guard of a statement that must run in the store's own transaction. */
export const MSSQL_NO_STORE_TRANSACTION = 51004;

/** THROW number of MSSQL_OWN_TRANSACTION_GUARD. */
export const MSSQL_NESTED_OWN_TRANSACTION = 51005;

/**
 * Opens the first statement of every transaction this library begins itself (migrate, the
 * schedule fire, the Service Broker transport's sends, rings and setup): inside it @@TRANCOUNT
 * must be exactly 1. Above 1, the connection the pool handed out already had a transaction: one
 * an application left open on a shared pool, or one IMPLICIT_TRANSACTIONS ON opened (the doc
 * lists BEGIN TRANSACTION among the statements that first run "an unseen BEGIN TRANSACTION";
 * whether tedious's begin request counts as one is server fact i of the live suite). Our commit
 * would then only decrement the count: nothing committed, every lock held, and the connection
 * back in the pool with the transaction open. So the statement refuses before doing anything,
 * and the caller rolls back. It reads no table and costs no round trip.
 */
export const MSSQL_OWN_TRANSACTION_GUARD = `IF @@TRANCOUNT > 1
  THROW ${MSSQL_NESTED_OWN_TRANSACTION}, N'nestjs-sql-queue: a transaction it began is nested in another one its pooled connection already had (a transaction left open, or IMPLICIT_TRANSACTIONS ON, on a shared pool); refusing, as its commit would commit nothing', 1;
`;

/**
 * Opens the statements that run inside a transaction the store itself opened
 * (fireDueSchedules: `new sql.Transaction(pool)`, begun READ COMMITTED, committed or rolled back
 * by the store), so the autocommit guard of MSSQL_STORE_SESSION cannot open them: they refuse
 * to run without a transaction instead, since their locks (the fire's U locks on the schedules
 * it holds) must last until the jobs are enqueued and the schedules advanced, and would
 * otherwise end with the statement. The session options as MSSQL_STORE_SESSION, and
 * DEADLOCK_PRIORITY LOW for the same reason (the store rolls back and the scheduler's next round
 * fires again; an application's transaction should not be the victim). Like every SET here it
 * reverts when its sp_executesql batch ends, so it covers scheduleLockDue and scheduleAdvance
 * only: the enqueue batch between them runs at the session's own priority (ENQUEUE_SESSION sets
 * none). The isolation level is the transaction's own (begun READ COMMITTED).
 */
export const MSSQL_STORE_TRANSACTION_SESSION = `IF @@TRANCOUNT = 0
  THROW ${MSSQL_NO_STORE_TRANSACTION}, N'nestjs-sql-queue: this statement runs in the store''s own transaction, but its connection has none', 1;
${MSSQL_OWN_TRANSACTION_GUARD}${SESSION_SETTINGS}SET DEADLOCK_PRIORITY LOW;
`;

/** Wraps statements that must commit together (a state change and its attempt row). */
export function atomically(body: string): string {
  // XACT_ABORT makes a client timeout (attention) roll the transaction back instead of leaving
  // it open on a pooled connection; set inside sp_executesql, it reverts when the batch ends.
  return `SET XACT_ABORT ON;
BEGIN TRY
  BEGIN TRANSACTION;
${body}
  COMMIT TRANSACTION;
END TRY
BEGIN CATCH
  IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
  THROW;
END CATCH;`;
}

/** THROW number of enqueue when the caller's transaction is no longer open on the server. */
export const MSSQL_CALLER_TRANSACTION_GONE = 51002;
