import { DONE_SCAN_LIMIT, GROUP_SCAN_LIMIT, JOB_PREVIEW_CHARS } from '../../core/types.js';
import { MSSQL_KEY_LOCK_REFUSED } from './mssql.errors.js';
import { quoteMssqlIdentifier } from './mssql.identifiers.js';

/**
 * T-SQL statements, one function each, named by what they do. Values are always parameters
 * (@name); the only text spliced in is the schema name, validated at boot and bracket-quoted.
 * Batches of jobs travel as table-valued parameters of the types created by the migrations.
 *
 * Times come from the database clock (SYSUTCDATETIME()). Millisecond offsets that may exceed
 * the int range of DATEADD are applied as seconds plus a millisecond remainder.
 *
 * Every statement here is parsed by a T-SQL grammar in the test suite.
 */
export interface MssqlQueries {
  enqueueOne: string;
  enqueueMany: string;
  /** enqueueOne and enqueueMany when a job has a group key (the ungrouped ones stay as they were). */
  enqueueOneGrouped: string;
  enqueueManyGrouped: string;
  recordQueueSetting: string;
  claim: string;
  heartbeat: string;
  complete: string;
  fail: string;
  release: string;
  reap: string;
  listBlockedGroups: string;
  findGroupProblems: string;
  repairGroup: string;
  hasClaimableWork: string;
  stats: string;
  getJob: string;
  getAttempts: string;
  listDead: string;
  retryDead: string;
  retryAllDead: string;
  purgeDead: string;
  /** purgeDead of the dead jobs among some ids (a table-valued parameter). */
  purgeDeadIds: string;
  cleanup: string;
  ping: string;

  // ---- browsing jobs and counting outcomes (the dashboard) ----
  listReadyJobs: string;
  listDelayedJobs: string;
  listLeasedJobs: string;
  listDoneJobs: string;
  listDeadJobs: string;
  recordThroughput: string;
  readThroughput: string;
  cleanupThroughput: string;

  // ---- health and measurements ----
  queueHealth: string;

  // ---- recurring jobs (schedules) ----
  scheduleDueIn: string;
  /** scheduleLockDue and scheduleAdvance run in fireDueSchedules' own transaction (MSSQL_STORE_TRANSACTION_SESSION). */
  scheduleLockDue: string;
  scheduleAdvance: string;
  scheduleUpsert: string;
  scheduleGet: string;
  scheduleList: string;
  scheduleDelete: string;
  schedulePause: string;
}

/** Table types; the store names them when it binds table-valued parameters. */
export const MSSQL_TABLE_TYPES = {
  jobInput: 'JobInputListV3',
  owned: 'OwnedJobList',
  heartbeat: 'HeartbeatList',
  failure: 'FailureList',
  ids: 'IdList',
  scheduleUpsert: 'ScheduleUpsertList',
  scheduleAdvance: 'ScheduleAdvanceList',
  throughputCounts: 'ThroughputCountList',
} as const;

/** `now` (SYSUTCDATETIME() by default) moved by a bigint count of milliseconds (sign: +1 future, -1 past). */
function shiftedNow(param: string, sign: 1 | -1, now = 'SYSUTCDATETIME()'): string {
  const op = sign === 1 ? '' : '-';
  return `DATEADD(millisecond, ${op}CAST(${param} % 1000 AS int), DATEADD(second, ${op}CAST(${param} / 1000 AS int), ${now}))`;
}

/**
 * Reserves a contiguous range of job ids into @firstId. (NEXT VALUE FOR would do for one row,
 * but a range lets a batch know its ids before the insert, without trusting output order.)
 */
function reserveIds(count: string, sequence: string): string {
  return `DECLARE @range sql_variant;
EXEC sys.sp_sequence_get_range @sequence_name = N'${sequence}', @range_size = ${count}, @range_first_value = @range OUTPUT;
DECLARE @firstId bigint = CAST(@range AS bigint);`;
}

const JOB_COLUMNS = `CAST([Id] AS varchar(20)) AS [Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey],
  [IdempotencyKey], [Attempts], [MaxAttempts], CAST([ClaimToken] AS char(36)) AS [ClaimToken], [LeaseUntil], [WorkerId],
  [CreatedAt], [ClaimedAt], [FinishedAt], [LastError]`;

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
const SESSION_SETTINGS = `SET NOCOUNT ON;
SET IMPLICIT_TRANSACTIONS OFF;
SET ROWCOUNT 0;
`;

/** The guard's THROW (after an IF on @@TRANCOUNT) when the store's own connection has an open transaction. */
const OPEN_TRANSACTION_THROW = `  THROW ${MSSQL_OPEN_TRANSACTION}, N'nestjs-sql-queue: the store runs this statement in autocommit mode, but its connection has an open transaction', 1;
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

/**
 * The hints of every READPAST claim (claim, reaper), exactly the seed's. UPDLOCK makes the read
 * a locking one and keeps the rows to the end of the statement; READPAST skips rows another
 * claimer holds; READCOMMITTEDLOCK is there because "the READPAST table hint can't be specified
 * when the READ_COMMITTED_SNAPSHOT database option is set to ON and ... the transaction
 * isolation level of the session is READ COMMITTED ... include the READCOMMITTEDLOCK table
 * hint" (its own locking is moot: "when UPDLOCK is specified, the READCOMMITTED and
 * READCOMMITTEDLOCK isolation level hints are ignored").
 * No ROWLOCK here: the same page says "SQL Server doesn't allow for more than one table hint
 * from each of the following groups ... Granularity hints: PAGLOCK, NOLOCK, READCOMMITTEDLOCK,
 * ROWLOCK, TABLOCK, or TABLOCKX" (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table).
 * NServiceBus's SQL transport (PR #1277/#1278) and Orleans (PR #10505) do ship
 * (UPDLOCK, READPAST, ROWLOCK, READCOMMITTEDLOCK), so the engine accepts it in practice, but
 * that is undocumented behaviour; the documented form is the seed's. Every other statement that
 * writes Jobs or Attempts carries ROWLOCK (no other granularity hint).
 */
const CLAIM_HINTS = 'UPDLOCK, READPAST, READCOMMITTEDLOCK';

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
function atomically(body: string): string {
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

/**
 * Opens both enqueue statements. @inTransaction = 1: the statement runs in the caller's open
 * transaction, which it joins and never commits; it sets only the options that are safe inside
 * it (SESSION_SETTINGS; turning IMPLICIT_TRANSACTIONS off does not end it) and refuses to run
 * when that transaction is no longer open on the server (an earlier error rolled it back): the
 * job would otherwise commit on its own while the caller's work is gone. The caller's isolation
 * level is left alone. SET TRANSACTION ISOLATION LEVEL READ COMMITTED would be legal even in a
 * SNAPSHOT transaction, but it reverts to SNAPSHOT when the statement returns, and "a
 * transaction cannot be set to SNAPSHOT isolation level that started with another isolation
 * level; doing so will cause the transaction to abort ... A transaction starts the first time
 * it accesses data" (https://learn.microsoft.com/sql/t-sql/statements/set-transaction-isolation-level-transact-sql):
 * a SNAPSHOT transaction whose first data access is this enqueue would then abort. The one
 * read that must see the latest committed key says so itself (READCOMMITTEDLOCK, which "reads
 * ... by using locking ... regardless of the setting of the READ_COMMITTED_SNAPSHOT database
 * option", and a table hint overrides the transaction's isolation level for that table).
 * @inTransaction = 0: the store's own connection, as MSSQL_STORE_SESSION (no open transaction,
 * READ COMMITTED), plus XACT_ABORT for the transaction the statement opens itself.
 */
const ENQUEUE_SESSION = `${SESSION_SETTINGS}IF @inTransaction = 0 AND @@TRANCOUNT <> 0
${OPEN_TRANSACTION_THROW}IF @inTransaction = 1 AND @@TRANCOUNT = 0
  THROW ${MSSQL_CALLER_TRANSACTION_GONE}, N'nestjs-sql-queue: the transaction passed to enqueue is no longer open on the server', 1;
IF @inTransaction = 0
BEGIN
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  SET XACT_ABORT ON;
END;
`;

/**
 * The enqueue's now, read once and cut to the millisecond: RunAt and State are both set from it.
 * SYSUTCDATETIME() is datetime2(7), and storing it in a datetime2(3) column rounds, so half of
 * the enqueues without a delay stored a RunAt up to 0.5 ms past the statement's clock while the
 * claim compares with an unrounded SYSUTCDATETIME(): a claim within that half millisecond missed
 * the job. A CAST to datetime2(3) would round too (datetime2, "Converting date and time data");
 * subtracting the sub-millisecond nanoseconds makes the value exact at datetime2(3), so the
 * stored RunAt is never later than the clock of a claim that follows. DATEPART(nanosecond, …)
 * of a datetime2 counts in units of 100 ns, at most 999,999,900, so the offset fits DATEADD's int.
 */
const ENQUEUE_NOW = `DECLARE @now datetime2(7) = SYSUTCDATETIME();
SET @now = DATEADD(nanosecond, -(DATEPART(nanosecond, @now) % 1000000), @now);
`;

/**
 * The application-lock resource of one idempotency key: the schema, queue and key hashed
 * (SHA2_256; queue and schema names cannot contain '/'), as 64 hex digits without 0x (CONVERT
 * binary style 2, https://learn.microsoft.com/sql/t-sql/functions/cast-and-convert-transact-sql),
 * under a prefix: 85 characters, within sp_getapplock's nvarchar(255). A hash collision only
 * makes two keys serialize. The key compares exactly (binary collation, no trailing spaces:
 * validation refuses them), so equal keys always hash alike.
 */
function keyLockResource(schema: string, queue: string, key: string): string {
  return `N'nestjs-sql-queue:key:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'${schema.toLowerCase()}/', ${queue}, N'/', ${key})), 2)`;
}

/**
 * One idempotency key's lock, held by the transaction until it commits or rolls back
 * (https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql:
 * "When the lock_owner value is Transaction ... sp_getapplock must be executed from within a
 * transaction"). It waits as any lock does (@@LOCK_TIMEOUT, else up to the request timeout). A
 * result below 0 is no lock (-1 timeout, -2 cancelled, -3 deadlock victim, -999 call error),
 * and "a deadlock with an application lock does not roll back the transaction that requested
 * the application lock", so it is thrown: keyedWork rolls back its own transaction, and a
 * caller's stays the caller's to roll back (doomed already if the caller's session has
 * XACT_ABORT on: "The THROW statement honors SET XACT_ABORT",
 * https://learn.microsoft.com/sql/t-sql/statements/set-xact-abort-transact-sql).
 */
function takeKeyLock(indent: string, what = 'idempotency key'): string {
  return `${indent}EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction';
${indent}IF @lock < 0
${indent}BEGIN
${indent}  SET @refused = CONCAT(N'nestjs-sql-queue: ${what} lock not granted (sp_getapplock returned ', @lock, N')');
${indent}  THROW ${MSSQL_KEY_LOCK_REFUSED}, @refused, 1;
${indent}END;`;
}

/**
 * The application-lock resource of one ordered group, as keyLockResource with its own prefix.
 * Every session that inserts a group row holds it first (producers, retryDead, the repair
 * sweep), so two of them never race to create one row: the loser of such a race would get
 * error 2627, which dooms the transaction it runs in (XACT_ABORT, or the caller's), so it could
 * not be retried inside the statement. Producers of groups whose row exists never take it.
 */
function groupLockResource(schema: string, queue: string, key: string): string {
  return `N'nestjs-sql-queue:group:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'${schema.toLowerCase()}/', ${queue}, N'/', ${key})), 2)`;
}

/**
 * The application-lock resource of one schedule id, as keyLockResource with its own prefix:
 * every upsert holds the locks of its ids (scheduleUpsert).
 */
function scheduleLockResource(schema: string, id: string): string {
  return `N'nestjs-sql-queue:schedule:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'${schema.toLowerCase()}/', ${id})), 2)`;
}

/**
 * Runs an enqueue's keyed work in a transaction: the caller's (@inTransaction = 1: joined,
 * never committed or rolled back here), else one it opens and commits itself, rolled back on
 * any error (XACT_ABORT is on for it, so a client timeout rolls it back too and never leaves it
 * open on a pooled connection).
 *
 * Why a key lock and not the range lock of UPDLOCK + HOLDLOCK on the unique index: a
 * serializable range lock on a missing key is taken on the next existing key, so it covers the
 * whole gap up to it ("Singleton Fetch of Nonexistent Data", Transaction Locking and Row
 * Versioning Guide). With rising business keys every new key of a queue fell in one gap, so all
 * keyed producers of the queue waited for the slowest open caller transaction, and two bulk
 * enqueues whose keys shared gaps deadlocked (RangeS-U is incompatible with RangeS-U and with
 * RangeI-N). The application lock is on the key itself: producers of one key serialize, others
 * never wait on each other. The check then needs no HOLDLOCK: no other producer can insert the
 * key while the lock is held, and READCOMMITTEDLOCK makes it wait for (instead of read past the
 * version of) an uncommitted delete by cleanup under READ_COMMITTED_SNAPSHOT. FORCESEEK keeps
 * it a seek on UX_Jobs_Idempotency, so it touches no other key.
 */
function keyedWork(body: string): string {
  return `BEGIN TRY
  IF @inTransaction = 0 BEGIN TRANSACTION;
${body}
  IF @inTransaction = 0 COMMIT TRANSACTION;
END TRY
BEGIN CATCH
  IF @inTransaction = 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
  THROW;
END CATCH;`;
}

/** enqueueManyGrouped's record of the rows it inserted, for the groups they join. */
const INSERTED_GROUPED = `DECLARE @inserted TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [RunAt] datetime2(3) NOT NULL, [Priority] int NOT NULL);
`;

/** Declarations for activateGroups: its input (@heads, one row per group) and its lock list. */
const GROUP_HEADS = `DECLARE @heads TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Id] bigint NOT NULL, [RunAt] datetime2(3) NOT NULL, [Priority] int NOT NULL, [Found] bit NOT NULL DEFAULT (0),
  PRIMARY KEY ([Queue], [GroupKey]));
DECLARE @groupLocks TABLE ([Seq] int NOT NULL PRIMARY KEY, [Resource] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL);
DECLARE @groupSeq int = 1, @groupLockCount int;
`;

/**
 * A producer's side of the idle → active edge (research A.2, "SQL Server"), in the transaction
 * that inserted the jobs and after the insert: @heads holds, per group, the lowest new job.
 * - A group with no row gets one headed by that job, under the group's application lock
 *   (groupLockResource), taken in resource order like the key locks.
 * - An existing row is headed by the job when the group is idle (no head, not held, not
 *   blocked) or headed by a later job (an earlier-numbered job committing late). A held group is
 *   left alone: its holder moves the head when it releases it, and sees this job then (its read
 *   of the next head is a dirty one, which sees uncommitted jobs), because it locks the row
 *   before that read and this statement reads the row after the insert.
 * Every read of Groups here is a locking read (READCOMMITTEDLOCK): it waits for a transition
 * that is emptying the group right now and reads what that committed. Under
 * READ_COMMITTED_SNAPSHOT a plain read would see the version before, and with optimized
 * locking an UPDATE qualifies rows on their last committed version without waiting; "to force
 * blocking between two queries when optimized locking is enabled, use the READCOMMITTEDLOCK
 * query hint" (https://learn.microsoft.com/sql/relational-databases/performance/optimized-locking).
 * The wait that matters is the existence check's: it runs after the insert, so a transition
 * that locked the row before it is waited for, and one that locks it after it reads the job
 * (dirty). Once a job is in, no transition deletes its group's row (each deletes only when its
 * dirty read finds no unfinished job), so what the existence check found stays. The UPDATE
 * keeps the hint too: it qualifies the row as committed now, in a caller's SNAPSHOT
 * transaction as well. READCOMMITTEDLOCK fills the granularity slot (no ROWLOCK beside it), so
 * the bulk reads and the UPDATE are made to seek each group's row (FORCESEEK): a scan of
 * Groups could take page locks, held to the caller's commit, which READPAST claims of the
 * other groups on those pages cannot skip.
 */
function activateGroups(schema: string, groups: string): string {
  const headOf = `  UPDATE g
  SET [HeadId] = h.[Id], [HeadReadyAt] = h.[RunAt], [HeadPriority] = h.[Priority], [Waiting] = ${waitingFor('h.[RunAt]')},
      [UpdatedAt] = SYSUTCDATETIME()
  FROM ${groups} AS g WITH (READCOMMITTEDLOCK, FORCESEEK)
  INNER JOIN @heads AS h ON g.[Queue] = h.[Queue] AND g.[GroupKey] = h.[GroupKey]
  WHERE g.[HeldToken] IS NULL AND g.[Blocked] = 0 AND (g.[HeadId] IS NULL OR g.[HeadId] > h.[Id]);`;
  const found = (indent: string, extra: string) => `${indent}UPDATE h SET [Found] = 1
${indent}FROM @heads AS h
${indent}WHERE ${extra}EXISTS (SELECT 1 FROM ${groups} AS g WITH (READCOMMITTEDLOCK, FORCESEEK) WHERE g.[Queue] = h.[Queue] AND g.[GroupKey] = h.[GroupKey]);`;
  return `${found('  ', '')}
  IF EXISTS (SELECT 1 FROM @heads WHERE [Found] = 0)
  BEGIN
    INSERT INTO @groupLocks ([Seq], [Resource])
    SELECT ROW_NUMBER() OVER (ORDER BY r.[Resource]), r.[Resource]
    FROM (SELECT DISTINCT ${groupLockResource(schema, 'h.[Queue]', 'h.[GroupKey]')} AS [Resource]
          FROM @heads AS h WHERE h.[Found] = 0) AS r;
    SET @groupLockCount = @@ROWCOUNT;
    WHILE @groupSeq <= @groupLockCount
    BEGIN
      SET @resource = (SELECT [Resource] FROM @groupLocks WHERE [Seq] = @groupSeq);
${takeKeyLock('      ', 'group')}
      SET @groupSeq = @groupSeq + 1;
    END;
    -- Under the locks: a row another producer created meanwhile is found, the others created.
${found('    ', 'h.[Found] = 0 AND ')}
    INSERT INTO ${groups} WITH (ROWLOCK) ([Queue], [GroupKey], [HeadId], [HeadReadyAt], [HeadPriority], [Waiting])
    SELECT [Queue], [GroupKey], [Id], [RunAt], [Priority], ${waitingFor('[RunAt]')} FROM @heads WHERE [Found] = 0;
  END;
${headOf}`;
}

/**
 * The filter of IX_Groups_Claimable, literally: a filtered index serves a query whose predicate
 * contains its filter (https://learn.microsoft.com/sql/relational-databases/indexes/create-filtered-indexes).
 */
export const CLAIMABLE_GROUP = '[HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 0';

/** The filter of IX_Groups_Waiting, literally (see CLAIMABLE_GROUP): an idle group whose head was not due when set. */
export const WAITING_GROUP = '[HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 1';

/**
 * [Waiting] of a group headed by a job that runs at `runAt` (null: no head, or a blocked one),
 * on the clock of the statement that sets the head (SYSUTCDATETIME() is read per statement, so
 * in a caller's long transaction too it is the time of the write, not of the transaction start).
 * A head due when set stays due, so IX_Groups_Claimable holds only due groups.
 */
function waitingFor(runAt: string): string {
  return `CASE WHEN ${runAt} > SYSUTCDATETIME() THEN 1 ELSE 0 END`;
}

/**
 * How long a claim leaves a group alone when its cached head could not be leased (not
 * committed yet, rolled back, or not the group's first job any more): the head is recomputed at
 * once, and the pause keeps claimers from spinning on a producer's open transaction.
 */
const STALE_HEAD_PAUSE_MS = 200;

/** The filter of IX_Jobs_Group, literally (see CLAIMABLE_GROUP): a group's unfinished jobs. */
export const UNFINISHED_GROUPED = "[GroupKey] IS NOT NULL AND [State] IN ('ready', 'delayed', 'leased')";

/** retryDead's record of the jobs it made ready again, and activateGroups' declarations. */
const RETRIED = `DECLARE @retried TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [RunAt] datetime2(3) NOT NULL, [Priority] int NOT NULL);
DECLARE @resource nvarchar(255), @lock int, @refused nvarchar(2048);
${GROUP_HEADS}`;

/**
 * What is wrong with a group row, by its jobs (the repair sweep's oracle, design (a)): a held
 * group needs a job leased with its token; a blocked one a dead job of the group as its head;
 * any other must be headed by its lowest unfinished job, and a row with none is not needed.
 * `row`: the alias of a row with HeadId, HeldToken, Blocked, Queue and GroupKey, or null for
 * the variables @headId, @held, @blocked, @queue, @groupKey; `first`: the lowest unfinished id.
 */
function groupProblem(jobs: string, row: string | null, first: string): string {
  const c = (column: string, variable: string) => (row ? `${row}.[${column}]` : variable);
  const [queue, key, head, held, blocked] = [
    c('Queue', '@queue'),
    c('GroupKey', '@groupKey'),
    c('HeadId', '@headId'),
    c('HeldToken', '@held'),
    c('Blocked', '@blocked'),
  ];
  return `CASE
  WHEN ${held} IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM ${jobs} AS l WITH (READUNCOMMITTED)
    WHERE l.[State] = 'leased' AND l.[GroupKey] IS NOT NULL AND l.[ClaimToken] = ${held}
      AND l.[Queue] = ${queue} AND l.[GroupKey] = ${key})
    THEN CONCAT(N'held by token ', LOWER(CAST(${held} AS char(36))), N', which no leased job of the group has')
  WHEN ${blocked} = 1 AND NOT EXISTS (
    SELECT 1 FROM ${jobs} AS d WITH (READUNCOMMITTED)
    WHERE d.[Id] = ${head} AND d.[Queue] = ${queue} AND d.[GroupKey] = ${key} AND d.[State] = 'dead')
    THEN CONCAT(N'blocked by job ', COALESCE(CAST(${head} AS nvarchar(20)), N'none'), N', which is not a dead job of the group')
  WHEN ${held} IS NULL AND ${blocked} = 0 AND ${head} IS NULL AND ${first} IS NULL
    THEN N'no unfinished job, but a row'
  WHEN ${held} IS NULL AND ${blocked} = 0 AND (${head} IS NULL OR ${first} IS NULL OR ${head} <> ${first})
    THEN CONCAT(N'head ', COALESCE(CAST(${head} AS nvarchar(20)), N'none'), N' is not the first unfinished job ',
                COALESCE(CAST(${first} AS nvarchar(20)), N'(none)'))
  END`;
}

/** BlockId of settleGroups: the lowest job of the group that died, if its queue's groups stop on one (q: QueueSettings). */
function blockingJob(alias: string): string {
  return `MIN(CASE WHEN ${alias}.[State] = 'dead' AND q.[GroupOnDead] = 'block' THEN ${alias}.[Id] END)`;
}

/** Declarations for settleGroups: the groups a transition touched, by the token its jobs held. */
const TOUCHED_GROUPS = `DECLARE @touched TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Token] uniqueidentifier NOT NULL, [BlockId] bigint NULL,
  PRIMARY KEY ([Queue], [GroupKey], [Token]));
`;

/** The lowest unfinished job of group `alias` (a dirty read: it sees a producer's uncommitted job). */
function firstUnfinished(
  jobs: string,
  queue: string,
  key: string,
  columns = 'u.[Id], u.[RunAt], u.[Priority]',
): string {
  return `(SELECT TOP (1) ${columns} FROM ${jobs} AS u WITH (READUNCOMMITTED)
     WHERE u.[Queue] = ${queue} AND u.[GroupKey] = ${key} AND u.[GroupKey] IS NOT NULL
       AND u.[State] IN ('ready', 'delayed', 'leased')
     ORDER BY u.[Id])`;
}

/** Each group's lowest job of `jobs` (a table variable with Queue, GroupKey, Id, RunAt, Priority) into @heads. */
function lowestPerGroupInto(jobs: string, indent: string): string {
  return [
    'INSERT INTO @heads ([Queue], [GroupKey], [Id], [RunAt], [Priority])',
    'SELECT f.[Queue], f.[GroupKey], f.[Id], f.[RunAt], f.[Priority]',
    'FROM (SELECT n.[Queue], n.[GroupKey], n.[Id], n.[RunAt], n.[Priority],',
    '             ROW_NUMBER() OVER (PARTITION BY n.[Queue], n.[GroupKey] ORDER BY n.[Id]) AS [Nth]',
    `      FROM ${jobs} AS n WHERE n.[GroupKey] IS NOT NULL) AS f`,
    'WHERE f.[Nth] = 1;',
  ]
    .map((line) => indent + line)
    .join('\n');
}

/** The jobs a completion or release moved on (a table variable), for their groups. */
function movedJobsTable(name: string): string {
  return `DECLARE ${name} TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [Token] uniqueidentifier NOT NULL);
`;
}

/** Settles the groups of the grouped jobs in `moved` (a movedJobsTable), none of which died. */
function settleMovedGroups(moved: string, jobs: string, groups: string): string {
  return `  IF EXISTS (SELECT 1 FROM ${moved} WHERE [GroupKey] IS NOT NULL)
  BEGIN
    INSERT INTO @touched ([Queue], [GroupKey], [Token])
    SELECT DISTINCT [Queue], [GroupKey], [Token] FROM ${moved} WHERE [GroupKey] IS NOT NULL;
${settleGroups(jobs, groups)}
  END;`;
}

/**
 * The group side of complete, fail, release and reap, after their job changes and in their
 * transaction: @touched lists (queue, group, token) of the grouped jobs moved, and BlockId, the
 * lowest of them that died in a queue whose groups stop on a dead job. A transition applies to
 * a group held by its token, or held by none and not blocked (a late transition after the
 * reaper let the group go); a group another token holds is left alone.
 * 1. A group batch holds the group while any of its jobs is still leased with the token: such a
 *    group is left as it is, its row not even written. (A dirty read, after this transition's
 *    own job writes: of two transitions of one token at once, say a completion and the reaper,
 *    each writes its job before it reads the other's, so at least one sees both jobs moved.)
 * 2. The rows are locked, then the jobs are read: a producer that inserted a job into the
 *    group before this lock is seen by the dirty reads below, and one that inserts after it
 *    waits for this commit in its own update of the row (activateGroups), so the job is never
 *    missed by both. Every job write of the transition came before this lock, and every job
 *    read after it is a dirty one (it never waits), so a transition never holds a group row
 *    while waiting for a job row: no cycle with a producer that holds its new job and waits for
 *    the group row.
 * 3. A job that died under 'block' becomes the head of its group, which stops.
 * 4. Else the group is released, headed by its lowest unfinished job (a job retried after a
 *    failure is its own group's head again, with its new run time).
 * 5. A group left without a head is deleted; a producer adding a job creates it again.
 */
function settleGroups(jobs: string, groups: string, indent = '    '): string {
  const applies = `(g.[HeldToken] = t.[Token] OR (g.[HeldToken] IS NULL AND g.[Blocked] = 0))`;
  const join = `INNER JOIN @touched AS t ON g.[Queue] = t.[Queue] AND g.[GroupKey] = t.[GroupKey]`;
  return `${indent}DELETE t FROM @touched AS t
${indent}WHERE EXISTS (SELECT 1 FROM ${jobs} AS s WITH (READUNCOMMITTED)
${indent}              WHERE s.[State] = 'leased' AND s.[GroupKey] IS NOT NULL AND s.[ClaimToken] = t.[Token]);
${indent}UPDATE g SET [UpdatedAt] = SYSUTCDATETIME()
${indent}FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}WHERE ${applies};
${indent}UPDATE g
${indent}SET [HeldToken] = NULL, [Blocked] = 1, [HeadId] = t.[BlockId], [HeadReadyAt] = NULL, [HeadPriority] = NULL,
${indent}    [Waiting] = 0, [UpdatedAt] = SYSUTCDATETIME()
${indent}FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}WHERE t.[BlockId] IS NOT NULL AND ${applies};
${indent}UPDATE g
${indent}SET [HeldToken] = NULL, [HeadId] = n.[Id], [HeadReadyAt] = n.[RunAt], [HeadPriority] = n.[Priority],
${indent}    [Waiting] = ${waitingFor('n.[RunAt]')}, [UpdatedAt] = SYSUTCDATETIME()
${indent}FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}OUTER APPLY ${firstUnfinished(jobs, 'g.[Queue]', 'g.[GroupKey]')} AS n
${indent}WHERE t.[BlockId] IS NULL AND ${applies};
${indent}DELETE g FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}WHERE g.[HeadId] IS NULL AND g.[HeldToken] IS NULL AND g.[Blocked] = 0;`;
}

/** The filter of IX_Schedules_Due, literally (see CLAIMABLE_GROUP): schedules that will fire. */
export const UNPAUSED_SCHEDULE = '[Paused] = 0 AND [NextRunAt] IS NOT NULL';

const SCHEDULE_COLUMNS = `[Id], [Queue], [Cron], [Timezone], [Payload], [Options], [CatchUp], [Paused], [Source], [NextRunAt],
  [LastRunAt], [LastTick], [CreatedAt], [UpdatedAt]`;

// ---- browsing jobs and counting outcomes (the dashboard) -------------------------------------

/** The filters of the indexes the listings read, literally (see CLAIMABLE_GROUP). */
export const READY_UNGROUPED = "[State] = 'ready' AND [GroupKey] IS NULL";
export const DELAYED_UNGROUPED = "[State] = 'delayed' AND [GroupKey] IS NULL";
export const LEASED_JOB = "[State] = 'leased'";
export const DEAD_JOB = "[State] = 'dead'";
export const DONE_KEYLESS = "[State] = 'done' AND [IdempotencyKey] IS NULL";
export const DONE_KEYED = "[State] = 'done' AND [IdempotencyKey] IS NOT NULL";

/**
 * Every read of a listing: a dashboard never waits on a writer and never holds one up. READPAST
 * leaves out the rows locked at this instant (an enqueue not committed yet, a claim or completion
 * in flight), as queueHealth leaves them out of its counts; the next refresh shows them. Without it,
 * locking READ COMMITTED would wait on such rows, and would keep its shared locks on the rows whose
 * payload and error (nvarchar(max)) it reads until the statement ends, where a worker completing
 * one could deadlock with it. READCOMMITTEDLOCK: READPAST requires a locking read, also when
 * READ_COMMITTED_SNAPSHOT is on (see CLAIM_HINTS).
 */
const LIST_HINTS = 'READPAST, READCOMMITTEDLOCK';

/** Times no job sorts before, or after: a first page's position. */
const EARLIEST = 'DATETIME2FROMPARTS(1, 1, 1, 0, 0, 0, 0, 3)';
const LATEST = 'DATETIME2FROMPARTS(9999, 12, 31, 23, 59, 59, 999, 3)';
const BIGINT_MAX = '9223372036854775807';

/**
 * The start of the minute `at` (a datetime2(3)) is in, moved by `shift` whole minutes: DATEDIFF
 * counts the minute boundaries crossed since a datetime2 anchor on a boundary (an int until the
 * year 6000), DATEADD keeps the anchor's type. (DATETRUNC would need SQL Server 2022.)
 */
function minuteStart(at: string, shift = ''): string {
  const anchor = 'DATETIME2FROMPARTS(2000, 1, 1, 0, 0, 0, 0, 3)';
  return `DATEADD(minute, DATEDIFF(minute, ${anchor}, ${at})${shift}, ${anchor})`;
}

/**
 * Opens every listing. @page holds the page's jobs in order, each with the sort key it was read
 * at (the next page's cursor comes from it), filled by bounded index reads until it holds @want
 * rows: the page and one more, which says whether a next page exists. A read starts after the
 * position in the @from variables. ScanEnd marks the last entry a grouped read took when it
 * stopped at GROUP_SCAN_LIMIT entries, whatever its state: the next page starts after it.
 */
const LIST_PAGE = `DECLARE @page TABLE (
  [Seq] int NOT NULL PRIMARY KEY, [Part] tinyint NOT NULL, [Id] bigint NOT NULL, [KeyInt] int NULL,
  [KeyAt] datetime2(3) NULL, [KeyText] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [ScanEnd] bit NOT NULL DEFAULT 0);
DECLARE @want int = @limit + 1, @got int = 0, @fromInt int, @fromAt datetime2(3), @fromText nvarchar(255), @fromId bigint;
`;

/** A listing's order column: the variable holding its value at the position (the page keeps the same column). */
interface ListKey {
  column: string;
  desc?: true;
  from: '@fromInt' | '@fromAt' | '@fromText' | '@fromId';
}

/**
 * Appends to @page, until it holds @want rows, the queue's jobs of `filter` after the position,
 * in the order of `keys` (Id last) or `orderBy` (the index's own order, when it lists more
 * columns): one read per key column, equal to the position on the columns before it and past it
 * on that one, in that order. Each is a range of the index that starts at the position, so no
 * page reads the rows of the pages before it: one predicate with ORs would bound the seek by its
 * first column only, and a bulk enqueue gives thousands of jobs one RunAt.
 */
function keysetWalk(
  jobs: string,
  part: 1 | 2,
  filter: string,
  keys: readonly ListKey[],
  orderBy = keys.map((key) => `[${key.column}]${key.desc ? ' DESC' : ''}`).join(', '),
  indent = '',
): string {
  const kept = (from: ListKey['from']) => {
    const key = keys.find((k) => k.from === from);
    return key ? `[${key.column}]` : 'NULL';
  };
  const reads: string[] = [];
  for (let k = keys.length - 1; k >= 0; k--) {
    const key = keys[k]!;
    const after = [
      ...keys.slice(0, k).map((before) => `[${before.column}] = ${before.from}`),
      `[${key.column}] ${key.desc ? '<' : '>'} ${key.from}`,
    ];
    reads.push(
      [
        'IF @got < @want',
        'BEGIN',
        '  INSERT INTO @page ([Seq], [Part], [Id], [KeyInt], [KeyAt], [KeyText])',
        `  SELECT TOP (@want - @got) @got + ROW_NUMBER() OVER (ORDER BY ${orderBy}), ${part}, [Id], ${kept('@fromInt')}, ${kept('@fromAt')}, ${kept('@fromText')}`,
        `  FROM ${jobs} WITH (${LIST_HINTS})`,
        `  WHERE [Queue] = @queue AND ${filter} AND ${after.join(' AND ')}`,
        `  ORDER BY ${orderBy};`,
        '  SET @got = @got + @@ROWCOUNT;',
        'END;',
      ]
        .map((line) => indent + line)
        .join('\n'),
    );
  }
  return reads.join('\n');
}

/**
 * The ungrouped part of a ready or delayed listing (@part 1, or a first page): `from` sets the
 * @from variables to the cursor's position, or to one before every job.
 */
function ungroupedPart(jobs: string, filter: string, from: string, keys: readonly ListKey[]): string {
  return `IF @part IS NULL OR @part = 1
BEGIN
  SELECT ${from};
${keysetWalk(jobs, 1, filter, keys, undefined, '  ')}
END;
`;
}

/**
 * The grouped part of a ready or delayed listing (@part 2), after the ungrouped one: at most
 * GROUP_SCAN_LIMIT entries of IX_Jobs_Group in (GroupKey, Id) order, from the cursor's position
 * in this part or from its start. The index holds the queue's grouped ready, delayed and leased
 * jobs (State is an included column, not a key), so the read is bounded first and the state
 * checked after: the jobs in `state` go to @page, as many as it still needs, and so does the
 * last entry read when the read reached its bound (ScanEnd), so the next page continues after
 * it. The position is two ranges, the rest of its group and the groups after it (an OR would
 * bound the seek by GroupKey only, and read the group's entries before the position), each
 * bounded too and merged in index order; ROW_NUMBER counts the entries read.
 */
function groupedPart(jobs: string, state: 'ready' | 'delayed'): string {
  const range = (alias: string, after: string) => `SELECT ${alias}.* FROM (
        SELECT TOP (${GROUP_SCAN_LIMIT}) [Id], [GroupKey], [State] FROM ${jobs} WITH (${LIST_HINTS})
        WHERE [Queue] = @queue AND ${UNFINISHED_GROUPED} AND ${after}
        ORDER BY [GroupKey], [Id]) AS ${alias}`;
  return `IF @got < @want
BEGIN
  SELECT @fromText = CASE WHEN @part = 2 THEN @keyText ELSE N'' END, @fromId = CASE WHEN @part = 2 THEN @keyId ELSE 0 END;
  INSERT INTO @page ([Seq], [Part], [Id], [KeyInt], [KeyAt], [KeyText], [ScanEnd])
  SELECT TOP (@want - @got) @got + ROW_NUMBER() OVER (ORDER BY r.[GroupKey], r.[Id]), 2, r.[Id], NULL, NULL, r.[GroupKey],
    CASE WHEN r.[N] = ${GROUP_SCAN_LIMIT} THEN 1 ELSE 0 END
  FROM (
    SELECT TOP (${GROUP_SCAN_LIMIT}) e.[Id], e.[GroupKey], e.[State], ROW_NUMBER() OVER (ORDER BY e.[GroupKey], e.[Id]) AS [N]
    FROM (
      ${range('a', '[GroupKey] = @fromText AND [Id] > @fromId')}
      UNION ALL
      ${range('b', '[GroupKey] > @fromText')}) AS e
    ORDER BY e.[GroupKey], e.[Id]) AS r
  WHERE r.[State] = '${state}' OR r.[N] = ${GROUP_SCAN_LIMIT}
  ORDER BY r.[GroupKey], r.[Id];
  SET @got = @got + @@ROWCOUNT;
END;
`;
}

/**
 * The page's jobs in order, as listed (JobSummary's columns, previews cut here: a page never
 * carries whole payloads), with the sort key each was read at. A job that left `state` (or the
 * table) since it was read comes back without its columns (Found 0); its key still places the
 * next page. LEFT counts UTF-16 code units unless the column's collation is supplementary-aware.
 */
function listedJobs(jobs: string, state: string): string {
  const preview = (column: string) =>
    `CAST(LEFT(j.[${column}], ${JOB_PREVIEW_CHARS}) AS nvarchar(${JOB_PREVIEW_CHARS})) AS [${column}Preview]`;
  return `SELECT p.[Part], p.[KeyInt], p.[KeyAt], p.[KeyText], p.[ScanEnd], CAST(p.[Id] AS varchar(20)) AS [Id],
  CAST(CASE WHEN j.[Id] IS NULL THEN 0 ELSE 1 END AS bit) AS [Found], j.[Queue], j.[State], j.[Priority], j.[RunAt],
  j.[GroupKey], j.[IdempotencyKey], j.[Attempts], j.[MaxAttempts], j.[LeaseUntil], j.[WorkerId], j.[CreatedAt],
  j.[ClaimedAt], j.[FinishedAt], ${preview('Payload')}, ${preview('LastError')}
FROM @page AS p
LEFT JOIN ${jobs} AS j WITH (FORCESEEK, ${LIST_HINTS}) ON j.[Id] = p.[Id] AND j.[State] = '${state}'
ORDER BY p.[Seq];`;
}

/**
 * The DONE_SCAN_LIMIT most recent completions of all queues (FinishedAt, Id), newest first: the
 * newest end of each done index (keyless and keyed jobs), merged. Keys only: no row is looked up.
 */
function recentCompletions(jobs: string): string {
  const newest = (filter: string, alias: string) => `SELECT ${alias}.* FROM (
    SELECT TOP (${DONE_SCAN_LIMIT}) [FinishedAt], [Id] FROM ${jobs} WITH (${LIST_HINTS})
    WHERE ${filter}
    ORDER BY [FinishedAt] DESC, [Id] DESC) AS ${alias}`;
  return `(SELECT TOP (${DONE_SCAN_LIMIT}) m.[FinishedAt], m.[Id] FROM (
  ${newest(DONE_KEYLESS, 'a')}
  UNION ALL
  ${newest(DONE_KEYED, 'b')}) AS m
  ORDER BY m.[FinishedAt] DESC, m.[Id] DESC)`;
}

/**
 * The enqueue statements (enqueueOne, enqueueMany, each with or without ordered groups), and
 * enqueueMany's work on its table of jobs alone (enqueueManyBody: no session prefix, no answer).
 */
function enqueueStatements(schema: string) {
  const s = quoteMssqlIdentifier(schema);
  const jobs = `${s}.[Jobs]`;
  const sequence = `${s}.[JobIdSequence]`;
  const settings = `${s}.[QueueSettings]`;
  const groups = `${s}.[Groups]`;

  // A job whose RunAt is later than the enqueue's now waits as 'delayed', outside the ready
  // index the claim reads; the claim promotes it once due (see claim). Both read ENQUEUE_NOW,
  // taken once and cut to the millisecond (review 2, R2-9).
  const oneRunAt = `COALESCE(@runAt, ${shiftedNow('@delayMs', 1, '@now')})`;
  const manyRunAt = `COALESCE(i.[RunAt], ${shiftedNow('i.[DelayMs]', 1, '@now')})`;
  const stateFor = (runAt: string) => `CASE WHEN ${runAt} > @now THEN 'delayed' ELSE 'ready' END`;

  // Ordered groups: the new job joins its group (activateGroups, for one job): an existing row
  // is read (locking read) and headed by the job if idle or headed by a later one; a missing row
  // is created under the group's lock.
  const joinGroupOne = `    IF @groupKey IS NOT NULL
    BEGIN
      SELECT @headAt = [RunAt] FROM ${jobs} WHERE [Id] = @firstId;
      IF NOT EXISTS (SELECT 1 FROM ${groups} WITH (READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [GroupKey] = @groupKey)
      BEGIN
        SET @resource = ${groupLockResource(schema, '@queue', '@groupKey')};
${takeKeyLock('        ', 'group')}
        IF NOT EXISTS (SELECT 1 FROM ${groups} WITH (READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [GroupKey] = @groupKey)
          INSERT INTO ${groups} WITH (ROWLOCK) ([Queue], [GroupKey], [HeadId], [HeadReadyAt], [HeadPriority], [Waiting])
          VALUES (@queue, @groupKey, @firstId, @headAt, @priority, ${waitingFor('@headAt')});
      END;
      UPDATE ${groups} WITH (READCOMMITTEDLOCK)
      SET [HeadId] = @firstId, [HeadReadyAt] = @headAt, [HeadPriority] = @priority, [Waiting] = ${waitingFor('@headAt')},
          [UpdatedAt] = SYSUTCDATETIME()
      WHERE [Queue] = @queue AND [GroupKey] = @groupKey AND [HeldToken] IS NULL AND [Blocked] = 0
        AND ([HeadId] IS NULL OR [HeadId] > @firstId);
    END;
`;
  // The inserted jobs (not the ones an idempotency key found): each group's lowest.
  const joinGroupsMany = `
${lowestPerGroupInto('@inserted', '  ')}
${activateGroups(schema, groups)}`;
  const enqueueOne = (
    grouped: boolean,
  ) => `${ENQUEUE_SESSION}${ENQUEUE_NOW}DECLARE @id bigint, @created bit = 1, @lock int, @refused nvarchar(2048);
${reserveIds('1', sequence)}
${grouped ? 'DECLARE @headAt datetime2(3);\n' : ''}DECLARE @jobMaxAttempts int = @maxAttempts, @resource nvarchar(255);
IF @jobMaxAttempts IS NULL
  SET @jobMaxAttempts = COALESCE((SELECT [MaxAttempts] FROM ${settings} WHERE [Queue] = @queue), @defaultMaxAttempts);
${keyedWork(`  IF @idempotencyKey IS NOT NULL
  BEGIN
    SET @resource = ${keyLockResource(schema, '@queue', '@idempotencyKey')};
${takeKeyLock('    ')}
    SELECT @id = [Id] FROM ${jobs} WITH (READCOMMITTEDLOCK, FORCESEEK)
    WHERE [Queue] = @queue AND [IdempotencyKey] = @idempotencyKey AND [IdempotencyKey] IS NOT NULL;
    IF @id IS NOT NULL SET @created = 0;
  END;
  IF @created = 1
  BEGIN
    SET @id = @firstId;
    INSERT INTO ${jobs} WITH (ROWLOCK) ([Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey], [IdempotencyKey], [MaxAttempts],
                                        [TraceContext])
    VALUES (@firstId, @queue, ${stateFor(oneRunAt)}, @payload, @priority, ${oneRunAt}, @groupKey, @idempotencyKey, @jobMaxAttempts,
            @traceContext);
${grouped ? joinGroupOne : ''}  END;`)}
SELECT CAST(@id AS varchar(20)) AS [Id], @created AS [Created];`;
  // enqueueMany's work on @jobs (ENQUEUE_NOW first), without its session prefix and its answer:
  // also the Service Broker receiver's, inside the transaction that received the messages.
  const enqueueManyBody = (
    grouped: boolean,
  ) => `${grouped ? INSERTED_GROUPED : 'DECLARE @inserted TABLE ([Id] bigint NOT NULL PRIMARY KEY);\n'}DECLARE @keys TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Ord] int NOT NULL, [ExistingId] bigint NULL,
  PRIMARY KEY ([Queue], [IdempotencyKey]));
DECLARE @locks TABLE ([Seq] int NOT NULL PRIMARY KEY, [Resource] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL);
DECLARE @count bigint = (SELECT COUNT_BIG(*) FROM @jobs);
${reserveIds('@count', sequence)}
DECLARE @resource nvarchar(255), @lock int, @refused nvarchar(2048), @seq int = 1, @lockCount int;
${grouped ? GROUP_HEADS : ''}INSERT INTO @keys ([Queue], [IdempotencyKey], [Ord])
SELECT f.[Queue], f.[IdempotencyKey], f.[Ord]
FROM (SELECT [Queue], [IdempotencyKey], [Ord],
             ROW_NUMBER() OVER (PARTITION BY [Queue], [IdempotencyKey] ORDER BY [Ord]) AS [Nth]
      FROM @jobs WHERE [IdempotencyKey] IS NOT NULL) AS f
WHERE f.[Nth] = 1;
INSERT INTO @locks ([Seq], [Resource])
SELECT ROW_NUMBER() OVER (ORDER BY r.[Resource]), r.[Resource]
FROM (SELECT DISTINCT ${keyLockResource(schema, 'k.[Queue]', 'k.[IdempotencyKey]')} AS [Resource] FROM @keys AS k) AS r;
SET @lockCount = @@ROWCOUNT;
${keyedWork(`  WHILE @seq <= @lockCount
  BEGIN
    SET @resource = (SELECT [Resource] FROM @locks WHERE [Seq] = @seq);
${takeKeyLock('    ')}
    SET @seq = @seq + 1;
  END;
  UPDATE k
  SET [ExistingId] = (SELECT j.[Id] FROM ${jobs} AS j WITH (READCOMMITTEDLOCK, FORCESEEK)
                      WHERE j.[Queue] = k.[Queue] AND j.[IdempotencyKey] = k.[IdempotencyKey]
                        AND j.[IdempotencyKey] IS NOT NULL)
  FROM @keys AS k;
  INSERT INTO ${jobs} WITH (ROWLOCK) ([Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey], [IdempotencyKey], [MaxAttempts],
                                      [TraceContext])
  OUTPUT ${grouped ? 'inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[RunAt], inserted.[Priority] INTO @inserted ([Id], [Queue], [GroupKey], [RunAt], [Priority])' : 'inserted.[Id] INTO @inserted ([Id])'}
  SELECT @firstId + i.[Ord], i.[Queue], ${stateFor(manyRunAt)}, i.[Payload], i.[Priority],
         ${manyRunAt},
         i.[GroupKey], i.[IdempotencyKey], COALESCE(i.[MaxAttempts], q.[MaxAttempts], i.[DefaultMaxAttempts]),
         i.[TraceContext]
  FROM @jobs AS i
  LEFT JOIN @keys AS k ON k.[Queue] = i.[Queue] AND k.[IdempotencyKey] = i.[IdempotencyKey]
  LEFT JOIN ${settings} AS q ON q.[Queue] = i.[Queue]
  WHERE i.[IdempotencyKey] IS NULL OR (k.[Ord] = i.[Ord] AND k.[ExistingId] IS NULL);${grouped ? joinGroupsMany : ''}`)}`;
  const enqueueMany = (grouped: boolean) => `${ENQUEUE_SESSION}${ENQUEUE_NOW}${enqueueManyBody(grouped)}
SELECT i.[Ord],
       CAST(CASE WHEN n.[Id] IS NOT NULL THEN n.[Id] WHEN k.[ExistingId] IS NOT NULL THEN k.[ExistingId]
                 ELSE @firstId + k.[Ord] END AS varchar(20)) AS [Id],
       CAST(CASE WHEN n.[Id] IS NULL THEN 0 ELSE 1 END AS bit) AS [Created]
FROM @jobs AS i
LEFT JOIN @inserted AS n ON n.[Id] = @firstId + i.[Ord]
LEFT JOIN @keys AS k ON k.[Queue] = i.[Queue] AND k.[IdempotencyKey] = i.[IdempotencyKey]
ORDER BY i.[Ord];`;
  return { enqueueOne, enqueueMany, enqueueManyBody };
}

/**
 * The work of enqueueManyGrouped on the jobs of table variable @jobs (JobInputListV3, Ord 0..n-1,
 * at least one row), inside the transaction already open on the session, for a batch that
 * declares `@jobs` and `DECLARE @inTransaction bit = 1;` itself and sets its session options:
 * the Service Broker receiver moves received messages into the table queue with it, in the
 * transaction of the RECEIVE. It answers nothing and commits nothing; an error is thrown on,
 * with the transaction left to the caller (a refused lock: XACT_STATE() 1 with XACT_ABORT off).
 * Its variables (@now, @inserted, @keys, @locks, @count, @range, @firstId, @resource, @lock,
 * @refused, @seq, @lockCount, @heads, @groupLocks, @groupSeq, @groupLockCount) are its own.
 */
export function mssqlEnqueueInTransaction(schema: string): string {
  return `${ENQUEUE_NOW}${enqueueStatements(schema).enqueueManyBody(true)}`;
}

export function mssqlQueries(schema: string): MssqlQueries {
  const s = quoteMssqlIdentifier(schema);
  const schedules = `${s}.[Schedules]`;
  const jobs = `${s}.[Jobs]`;
  const attempts = `${s}.[Attempts]`;
  const settings = `${s}.[QueueSettings]`;
  const groups = `${s}.[Groups]`;
  const throughput = `${s}.[Throughput]`;

  const { enqueueOne, enqueueMany } = enqueueStatements(schema);

  // retryDead's group side, after the jobs are ready again (@retried), in its transaction. A
  // blocked group whose blocking job is retried is released, headed by the group's lowest
  // retried job; any other retried job joins its group as a new one would (activateGroups).
  const retryGroups = `  IF EXISTS (SELECT 1 FROM @retried WHERE [GroupKey] IS NOT NULL)
  BEGIN
${lowestPerGroupInto('@retried', '    ')}
    UPDATE g
    SET [Blocked] = 0, [HeadId] = h.[Id], [HeadReadyAt] = h.[RunAt], [HeadPriority] = h.[Priority],
        [Waiting] = ${waitingFor('h.[RunAt]')}, [UpdatedAt] = SYSUTCDATETIME()
    FROM ${groups} AS g WITH (ROWLOCK)
    INNER JOIN @heads AS h ON g.[Queue] = h.[Queue] AND g.[GroupKey] = h.[GroupKey]
    WHERE g.[Blocked] = 1 AND g.[HeldToken] IS NULL
      AND EXISTS (SELECT 1 FROM @retried AS r WHERE r.[Queue] = g.[Queue] AND r.[GroupKey] = g.[GroupKey] AND r.[Id] = g.[HeadId]);
${activateGroups(schema, groups)}
  END;`;

  // purgeDead and purgeDeadIds: the dead jobs of @queue finished before now - @olderThanMs,
  // and `only` (one more condition on them), at most @batch; then their blocked groups released.
  const purge = (only: string) => `${MSSQL_STORE_SESSION}DECLARE @purged TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL);
DECLARE @unblocked TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL, PRIMARY KEY ([Queue], [GroupKey]));
${atomically(`  DELETE TOP (@batch) FROM ${jobs} WITH (ROWLOCK)
  OUTPUT deleted.[Id], deleted.[Queue], deleted.[GroupKey] INTO @purged ([Id], [Queue], [GroupKey])
  WHERE [Queue] = @queue AND [State] = 'dead' AND [FinishedAt] <= ${shiftedNow('@olderThanMs', -1)}${only};
  IF EXISTS (SELECT 1 FROM @purged WHERE [GroupKey] IS NOT NULL)
  BEGIN
    UPDATE g
    SET [Blocked] = 0, [HeadId] = NULL, [HeadReadyAt] = NULL, [HeadPriority] = NULL, [Waiting] = 0, [UpdatedAt] = SYSUTCDATETIME()
    OUTPUT inserted.[Queue], inserted.[GroupKey] INTO @unblocked ([Queue], [GroupKey])
    FROM ${groups} AS g WITH (ROWLOCK)
    INNER JOIN @purged AS p ON g.[Queue] = p.[Queue] AND g.[GroupKey] = p.[GroupKey] AND g.[HeadId] = p.[Id]
    WHERE g.[Blocked] = 1;
    UPDATE g
    SET [HeadId] = n.[Id], [HeadReadyAt] = n.[RunAt], [HeadPriority] = n.[Priority], [Waiting] = ${waitingFor('n.[RunAt]')}
    FROM ${groups} AS g WITH (ROWLOCK)
    INNER JOIN @unblocked AS b ON g.[Queue] = b.[Queue] AND g.[GroupKey] = b.[GroupKey]
    CROSS APPLY ${firstUnfinished(jobs, 'g.[Queue]', 'g.[GroupKey]')} AS n;
    DELETE g FROM ${groups} AS g WITH (ROWLOCK)
    INNER JOIN @unblocked AS b ON g.[Queue] = b.[Queue] AND g.[GroupKey] = b.[GroupKey]
    WHERE g.[HeadId] IS NULL AND g.[HeldToken] IS NULL AND g.[Blocked] = 0;
  END;`)}
SELECT COUNT_BIG(*) AS [Deleted] FROM @purged;`;

  // A claim's ungrouped jobs (@jobUnits of them): the seed's READPAST claim of the ready index.
  const candidateJobs = `  WITH candidate AS (
    SELECT TOP (@jobUnits) *
    FROM ${jobs} WITH (${CLAIM_HINTS})
    WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
    ORDER BY [Priority] DESC, [RunAt], [Id]
  )
  UPDATE candidate
  SET [State] = 'leased', [ClaimToken] = NEWID(), [Attempts] = [Attempts] + 1,
      [LeaseUntil] = DATEADD(millisecond, @leaseMs, SYSUTCDATETIME()), [ClaimedAt] = SYSUTCDATETIME(), [WorkerId] = @workerId
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[Payload], inserted.[Priority], inserted.[GroupKey], inserted.[IdempotencyKey],
         inserted.[Attempts], inserted.[MaxAttempts], inserted.[ClaimToken], inserted.[CreatedAt], inserted.[ClaimedAt],
         inserted.[LeaseUntil], inserted.[Priority], inserted.[RunAt], inserted.[Id], inserted.[TraceContext]
  INTO @claimed;`;

  // The group side of a claim (@groupUnits groups), in one short transaction with the claim's
  // ungrouped jobs (so a failure, a deadlock victim's rollback say, leases nothing the store
  // could not repeat: ungrouped jobs leased and committed before it would be lost to the caller
  // until their lease expired):
  // 1. The best claimable groups are held: their rows are locked and skipped like the seed's
  //    ready rows (CLAIM_HINTS on Groups) and updated in place with a fresh token each. The group
  //    row is the only thing READPAST can skip here: skipping it means "another session is
  //    claiming or changing this group", never "this group has no head". The hold itself is a
  //    column (HeldToken), not a lock: it outlives this transaction, until the transition that
  //    releases it; only the holder's transitions move the head.
  // 2. Each group's first @groupBatchSize unfinished jobs are read twice:
  //    dirty (@window: every job there, committed or not, without a lock) and then locked
  //    (IX_Jobs_Group, CLAIM_HINTS; READPAST passes over a job another session has not
  //    committed), the locked read bounded by the last id of the window, so it never walks a
  //    deep group's jobs past the batch (a producer's thousand uncommitted jobs behind the head
  //    included). The batch is the head and the due jobs right behind it: a job leased, not due
  //    yet, or passed over (in the window, not locked: in flight) ends it, so a batch never
  //    steps over a job. Nothing is leased unless the first job read is the cached head or below
  //    it: a lower one (a job the head's setter could not see, or retried while the group was
  //    blocked by a later one) is the rightful head, and this transaction's lock on the group row
  //    makes its lease exclusive; the row is then headed by it. One above the cached head means
  //    a stale cache (step 4). (The read starts at the group's first job, not at the cached
  //    head: from the head, a batch would run past a lower job, or beside one still leased.)
  // 3. The batch is leased with the group's token, and returned in id order (the caller runs
  //    it in that order, one job after the other).
  // 4. A group whose head could not be leased (a producer's job not committed yet or rolled
  //    back, a stale head) is not held: its head is recomputed from a dirty read (which sees an
  //    uncommitted job, so a rolled-back one never strands the group), and it waits
  //    (IX_Groups_Waiting) for STALE_HEAD_PAUSE_MS; a group with no unfinished job left is deleted.
  const groupClaim = `  DECLARE @held TABLE (
    [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [HeadId] bigint NOT NULL,
    [HeadPriority] int NULL, [HeadReadyAt] datetime2(3) NULL, [Token] uniqueidentifier NOT NULL, [LastId] bigint NULL);
  DECLARE @window TABLE (
    [Id] bigint NOT NULL PRIMARY KEY, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL, [Seq] bigint NOT NULL);
  DECLARE @members TABLE (
    [Id] bigint NOT NULL PRIMARY KEY, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    [Seq] bigint NOT NULL, [Runnable] bit NOT NULL);
${atomically(`${candidateJobs}
  WITH g AS (
    SELECT TOP (@groupUnits) *
    FROM ${groups} WITH (${CLAIM_HINTS})
    WHERE [Queue] = @queue AND ${CLAIMABLE_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
    ORDER BY [HeadPriority] DESC, [HeadReadyAt], [HeadId]
  )
  UPDATE g
  SET [HeldToken] = NEWID(), [UpdatedAt] = SYSUTCDATETIME()
  OUTPUT inserted.[GroupKey], inserted.[HeadId], inserted.[HeadPriority], inserted.[HeadReadyAt], inserted.[HeldToken]
  INTO @held ([GroupKey], [HeadId], [HeadPriority], [HeadReadyAt], [Token]);
  INSERT INTO @window ([Id], [GroupKey], [Seq])
  SELECT w.[Id], h.[GroupKey], ROW_NUMBER() OVER (PARTITION BY h.[GroupKey] ORDER BY w.[Id])
  FROM @held AS h
  CROSS APPLY (
    SELECT TOP (@groupBatchSize) d.[Id]
    FROM ${jobs} AS d WITH (READUNCOMMITTED)
    WHERE d.[Queue] = @queue AND d.[GroupKey] = h.[GroupKey] AND d.[GroupKey] IS NOT NULL
      AND d.[State] IN ('ready', 'delayed', 'leased')
    ORDER BY d.[Id]
  ) AS w;
  UPDATE h SET [LastId] = (SELECT MAX(w.[Id]) FROM @window AS w WHERE w.[GroupKey] = h.[GroupKey])
  FROM @held AS h;
  INSERT INTO @members ([Id], [GroupKey], [Seq], [Runnable])
  SELECT m.[Id], h.[GroupKey], ROW_NUMBER() OVER (PARTITION BY h.[GroupKey] ORDER BY m.[Id]),
         CASE WHEN m.[State] <> 'leased' AND m.[RunAt] <= SYSUTCDATETIME() THEN 1 ELSE 0 END
  FROM @held AS h
  CROSS APPLY (
    SELECT TOP (@groupBatchSize) j.[Id], j.[State], j.[RunAt]
    FROM ${jobs} AS j WITH (${CLAIM_HINTS})
    WHERE j.[Queue] = @queue AND j.[GroupKey] = h.[GroupKey] AND j.[GroupKey] IS NOT NULL
      AND j.[State] IN ('ready', 'delayed', 'leased') AND j.[Id] <= h.[LastId]
    ORDER BY j.[Id]
  ) AS m;
  UPDATE m SET [Runnable] = 0
  FROM @members AS m
  WHERE NOT EXISTS (SELECT 1 FROM @window AS w WHERE w.[Id] = m.[Id] AND w.[Seq] = m.[Seq]);
  DELETE m FROM @members AS m
  WHERE EXISTS (SELECT 1 FROM @members AS x WHERE x.[GroupKey] = m.[GroupKey] AND x.[Seq] <= m.[Seq] AND x.[Runnable] = 0)
     OR NOT EXISTS (SELECT 1 FROM @members AS f INNER JOIN @held AS h ON h.[GroupKey] = f.[GroupKey]
                    WHERE f.[GroupKey] = m.[GroupKey] AND f.[Seq] = 1 AND f.[Id] <= h.[HeadId]);
  UPDATE j
  SET [State] = 'leased', [ClaimToken] = h.[Token], [Attempts] = j.[Attempts] + 1,
      [LeaseUntil] = DATEADD(millisecond, @leaseMs, SYSUTCDATETIME()), [ClaimedAt] = SYSUTCDATETIME(), [WorkerId] = @workerId
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[Payload], inserted.[Priority], inserted.[GroupKey], inserted.[IdempotencyKey],
         inserted.[Attempts], inserted.[MaxAttempts], inserted.[ClaimToken], inserted.[CreatedAt], inserted.[ClaimedAt],
         inserted.[LeaseUntil], h.[HeadPriority], h.[HeadReadyAt], h.[HeadId], inserted.[TraceContext]
  INTO @claimed
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @members AS m ON m.[Id] = j.[Id]
  INNER JOIN @held AS h ON h.[GroupKey] = m.[GroupKey]
  WHERE j.[State] IN ('ready', 'delayed');
  UPDATE g
  SET [HeadId] = f.[Id]
  FROM ${groups} AS g WITH (ROWLOCK)
  INNER JOIN @held AS h ON g.[Queue] = @queue AND g.[GroupKey] = h.[GroupKey]
  INNER JOIN @members AS f ON f.[GroupKey] = h.[GroupKey] AND f.[Seq] = 1
  WHERE f.[Id] < h.[HeadId] AND EXISTS (SELECT 1 FROM @claimed AS c WHERE c.[Id] = f.[Id]);
  UPDATE g
  SET [HeldToken] = NULL, [HeadId] = n.[Id], [HeadPriority] = n.[Priority],
      [HeadReadyAt] = CASE WHEN n.[RunAt] > DATEADD(millisecond, ${STALE_HEAD_PAUSE_MS}, SYSUTCDATETIME()) THEN n.[RunAt]
                           ELSE DATEADD(millisecond, ${STALE_HEAD_PAUSE_MS}, SYSUTCDATETIME()) END,
      [Waiting] = CASE WHEN n.[Id] IS NULL THEN 0 ELSE 1 END, [UpdatedAt] = SYSUTCDATETIME()
  FROM ${groups} AS g WITH (ROWLOCK)
  INNER JOIN @held AS h ON g.[Queue] = @queue AND g.[GroupKey] = h.[GroupKey]
  OUTER APPLY ${firstUnfinished(jobs, '@queue', 'h.[GroupKey]')} AS n
  WHERE NOT EXISTS (SELECT 1 FROM @claimed AS c WHERE c.[GroupKey] = h.[GroupKey]);
  DELETE g FROM ${groups} AS g WITH (ROWLOCK)
  INNER JOIN @held AS h ON g.[Queue] = @queue AND g.[GroupKey] = h.[GroupKey]
  WHERE g.[HeadId] IS NULL AND g.[HeldToken] IS NULL AND g.[Blocked] = 0;`)}`;

  return {
    // @queue, @payload, @priority, @runAt (null: now + @delayMs), @delayMs bigint, @groupKey,
    // @idempotencyKey, @maxAttempts (null: the queue's recorded setting), @defaultMaxAttempts,
    // @traceContext, @inTransaction (1: the caller's open transaction; see ENQUEUE_SESSION and keyedWork).
    // The setting is read into a variable first: COALESCE((subquery), …) runs the subquery twice.
    // With a key: the key's lock, then the existence check; the job's id is the existing one or
    // the reserved one, and nothing is read again after the insert.
    enqueueOne: enqueueOne(false),
    // The same for a job with a group key, which joins its group after the insert
    // (activateGroups, for one job). The job's run time is read back, not computed again.
    enqueueOneGrouped: enqueueOne(true),

    // ROWLOCK on both enqueue statements: READPAST skips locked rows but not locked pages, so
    // a large insert in a caller's long transaction must not take page locks that claims and
    // monitoring reads would then wait on (lock escalation is already off for the table).
    // @jobs JobInputListV3 with Ord = 0..n-1, @inTransaction. A range of ids is reserved first, so
    // every input row knows its id (first + Ord) whether or not it is inserted, and results come
    // back in input order. The first row of a key within the batch is the one inserted; later
    // ones get its id. First rows are found in one pass (ROW_NUMBER over the key: the table type
    // has no index on the key and SQL Server keeps no statistics on a TVP, so a correlated
    // "no earlier row" check could run once per row against every row). @keys is keyed by
    // (Queue, IdempotencyKey) so the joins below seek it. Key locks are taken one per distinct
    // resource, in resource order (@locks), the same order in every producer.
    // A row without its own MaxAttempts takes its queue's recorded setting, else its default.
    enqueueMany: enqueueMany(false),
    // The same when a job has a group key: each group's lowest new job joins it (activateGroups).
    enqueueManyGrouped: enqueueMany(true),

    // @queue, @maxAttempts, @groupOnDead ('continue' | 'block'): insert or update one queue's
    // settings. The UPDATE's UPDLOCK + HOLDLOCK hold the key (or, when it is missing, its range)
    // until commit, so two processes recording the same new queue at once serialize: the second
    // updates the row the first inserted instead of failing on the primary key. (Boot-time only:
    // the range lock on a missing queue costs nothing here.)
    recordQueueSetting: `${MSSQL_STORE_SESSION}${atomically(`  UPDATE ${settings} WITH (UPDLOCK, HOLDLOCK)
  SET [MaxAttempts] = @maxAttempts, [GroupOnDead] = @groupOnDead, [UpdatedAt] = SYSUTCDATETIME()
  WHERE [Queue] = @queue;
  IF @@ROWCOUNT = 0
    INSERT INTO ${settings} ([Queue], [MaxAttempts], [GroupOnDead]) VALUES (@queue, @maxAttempts, @groupOnDead);`)}`,

    // @limit (units), @groupBatchSize, @leaseMs, @queue, @workerId. The seed's pattern:
    // autocommit only (the session guard), the claim hints (CLAIM_HINTS: UPDLOCK takes and keeps
    // the read's locks, READPAST skips rows other claimers hold, READCOMMITTEDLOCK keeps READPAST
    // legal where READ_COMMITTED_SNAPSHOT is on); the CTE is updated in place and the OUTPUT goes
    // INTO a table variable (allowed with triggers present); NEWID() per row.
    // First, its own autocommit statement with the same hints: up to @limit of the queue's due
    // ungrouped delayed jobs, oldest first (a range seek on IX_Jobs_Delayed), become ready, so
    // the claim that follows sees them. The ready index holds no delayed rows, so neither
    // statement reads (or U-locks) the delayed backlog, whatever its priorities (review P2). A
    // promoted job another claimer takes first is simply claimed there.
    // Then, the same way, up to @limit due waiting groups (IX_Groups_Waiting, oldest first: a
    // group whose head was not due when it was set) join the claimable ones, so neither the
    // probe nor the claim below reads a group that is not due, however many there are and
    // whatever their priorities. The promoted ones compete in claim order with the others; a
    // group that loses its place stays claimable for the next claim.
    // Ordered groups (issue 11): a grouped job is never in IX_Jobs_Claim or IX_Jobs_Delayed; it
    // is claimed as its group's head, through the group's row. A queue without groups costs two
    // more seeks (empty ranges of IX_Groups_Waiting and IX_Groups_Claimable) and claims as
    // before. With some, the @limit units (an ungrouped job, or a group's batch) go to the best
    // of both in claim order, counted from a read that waits for no lock (READPAST) and keeps
    // none; the locking statements then take that many of each in one transaction (best effort,
    // as the order always is: a row another claimer holds is passed over). See groupClaim for
    // the group side.
    claim: `${MSSQL_STORE_SESSION}DECLARE @claimed TABLE (
  [Id] bigint NOT NULL, [Queue] nvarchar(128) NOT NULL, [Payload] nvarchar(max) NOT NULL, [Priority] int NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [IdempotencyKey] nvarchar(255) NULL, [Attempts] int NOT NULL,
  [MaxAttempts] int NOT NULL, [ClaimToken] uniqueidentifier NOT NULL, [CreatedAt] datetime2(3) NOT NULL,
  [ClaimedAt] datetime2(3) NOT NULL, [LeaseUntil] datetime2(3) NOT NULL,
  [UnitPriority] int NULL, [UnitAt] datetime2(3) NULL, [UnitId] bigint NOT NULL, [TraceContext] varchar(2048) NULL);
DECLARE @groupUnits int = 0, @jobUnits int;
WITH due AS (
  SELECT TOP (@limit) *
  FROM ${jobs} WITH (${CLAIM_HINTS})
  WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
  ORDER BY [RunAt], [Id]
)
UPDATE due
SET [State] = 'ready';
WITH promoted AS (
  SELECT TOP (@limit) *
  FROM ${groups} WITH (${CLAIM_HINTS})
  WHERE [Queue] = @queue AND ${WAITING_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
  ORDER BY [HeadReadyAt], [HeadId]
)
UPDATE promoted
SET [Waiting] = 0, [UpdatedAt] = SYSUTCDATETIME();
IF EXISTS (
  SELECT 1 FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND ${CLAIMABLE_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
)
  SELECT @groupUnits = COUNT(*) FROM (
    SELECT TOP (@limit) u.[Kind] FROM (
      SELECT g.[Kind], g.[Priority], g.[RunAt], g.[Id] FROM (
        SELECT TOP (@limit) 1 AS [Kind], [HeadPriority] AS [Priority], [HeadReadyAt] AS [RunAt], [HeadId] AS [Id]
        FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
        WHERE [Queue] = @queue AND ${CLAIMABLE_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
        ORDER BY [HeadPriority] DESC, [HeadReadyAt], [HeadId]) AS g
      UNION ALL
      SELECT j.[Kind], j.[Priority], j.[RunAt], j.[Id] FROM (
        SELECT TOP (@limit) 0 AS [Kind], [Priority], [RunAt], [Id]
        FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
        WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
        ORDER BY [Priority] DESC, [RunAt], [Id]) AS j
    ) AS u
    ORDER BY u.[Priority] DESC, u.[RunAt], u.[Id]
  ) AS best
  WHERE best.[Kind] = 1;
-- No claimable group: the ungrouped claim alone, in autocommit, as before ordered groups.
IF @groupUnits = 0
BEGIN
  SET @jobUnits = @limit;
${candidateJobs}
END
ELSE
BEGIN
  SET @jobUnits = @limit - @groupUnits;
${groupClaim}
END;
SELECT CAST([Id] AS varchar(20)) AS [Id], [Queue], [Payload], [Priority], [GroupKey], [IdempotencyKey], [Attempts], [MaxAttempts],
       CAST([ClaimToken] AS char(36)) AS [ClaimToken], [CreatedAt], [ClaimedAt], [LeaseUntil], [TraceContext]
FROM @claimed
ORDER BY [UnitPriority] DESC, [UnitAt], [UnitId], [Id];`,

    // @items HeartbeatList. The lease never runs past ClaimedAt + MaxMs; once that cap has passed
    // the lease cannot be renewed, and the answer is no lease (lost), not 'ok'.
    heartbeat: `${MSSQL_STORE_SESSION}DECLARE @extended TABLE ([Id] bigint NOT NULL PRIMARY KEY, [LeaseUntil] datetime2(3) NOT NULL);
UPDATE j
SET [LeaseUntil] = CASE
    WHEN i.[MaxMs] IS NULL OR DATEADD(millisecond, i.[LeaseMs], SYSUTCDATETIME()) < DATEADD(millisecond, i.[MaxMs], j.[ClaimedAt])
      THEN DATEADD(millisecond, i.[LeaseMs], SYSUTCDATETIME())
    ELSE DATEADD(millisecond, i.[MaxMs], j.[ClaimedAt]) END
OUTPUT inserted.[Id], inserted.[LeaseUntil] INTO @extended ([Id], [LeaseUntil])
FROM ${jobs} AS j WITH (ROWLOCK)
INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
WHERE j.[State] = 'leased';
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], CASE WHEN e.[LeaseUntil] > SYSUTCDATETIME() THEN e.[LeaseUntil] END AS [LeaseUntil]
FROM @items AS i LEFT JOIN @extended AS e ON e.[Id] = i.[Id];`,

    // @items OwnedJobList. The token stays on the done row, so a retried completion whose first
    // reply was lost is recognised ('already') instead of reported as lost. A grouped job's group
    // is settled in the same transaction (settleGroups): released once no job of its batch is
    // leased any more, headed by its next job.
    complete: `${MSSQL_STORE_SESSION}${movedJobsTable('@completed')}${TOUCHED_GROUPS}${atomically(`  UPDATE j
  SET [State] = 'done', [FinishedAt] = SYSUTCDATETIME(), [LeaseUntil] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[ClaimToken]
  INTO @completed ([Id], [Queue], [GroupKey], [Token])
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
  WHERE j.[State] = 'leased';
${settleMovedGroups('@completed', jobs, groups)}`)}
SELECT CAST(i.[Id] AS varchar(20)) AS [Id],
  CASE WHEN c.[Id] IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${jobs} AS d WHERE d.[Id] = i.[Id] AND d.[ClaimToken] = i.[Token] AND d.[State] = 'done') THEN 'already'
       ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @completed AS c ON c.[Id] = i.[Id];`,

    // @items FailureList. The state change and its attempt row commit together. A retry with a
    // delay waits as 'delayed' (out of the claim's ready index); the claim promotes it once due.
    // A grouped job's batch siblings (leased with its token, never started) go back to ready
    // with their attempt given back, and its group is settled: headed by the failed job again
    // (a retry keeps its place), or, when it died, by the next job ('continue') or stopped by it
    // ('block', the queue's recorded groupOnDead; 'continue' when none is recorded).
    fail: `${MSSQL_STORE_SESSION}DECLARE @failed TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [State] varchar(8) NOT NULL, [Attempt] int NOT NULL,
  [ClaimedAt] datetime2(3) NULL, [Token] uniqueidentifier NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL);
DECLARE @batchTokens TABLE ([Token] uniqueidentifier NOT NULL PRIMARY KEY);
${TOUCHED_GROUPS}${atomically(`  UPDATE j
  SET [State] = CASE WHEN i.[Dead] = 1 OR j.[Attempts] >= j.[MaxAttempts] THEN 'dead'
                     WHEN i.[DelayMs] > 0 THEN 'delayed' ELSE 'ready' END,
      [RunAt] = CASE WHEN i.[Dead] = 1 OR j.[Attempts] >= j.[MaxAttempts] THEN j.[RunAt]
                     ELSE DATEADD(millisecond, i.[DelayMs], SYSUTCDATETIME()) END,
      [FinishedAt] = CASE WHEN i.[Dead] = 1 OR j.[Attempts] >= j.[MaxAttempts] THEN SYSUTCDATETIME() ELSE NULL END,
      [ClaimToken] = NULL, [LeaseUntil] = NULL, [LastError] = i.[Error]
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[State], inserted.[Attempts], inserted.[ClaimedAt], deleted.[ClaimToken],
         inserted.[GroupKey]
  INTO @failed ([Id], [Queue], [State], [Attempt], [ClaimedAt], [Token], [GroupKey])
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
  WHERE j.[State] = 'leased';
  INSERT INTO ${attempts} WITH (ROWLOCK) ([JobId], [Queue], [Attempt], [Outcome], [Error], [Stack], [WorkerId], [ClaimToken], [StartedAt], [FinishedAt])
  SELECT f.[Id], f.[Queue], f.[Attempt], 'failed', i.[Error], i.[Stack], i.[WorkerId], f.[Token], f.[ClaimedAt], SYSUTCDATETIME()
  FROM @failed AS f INNER JOIN @items AS i ON i.[Id] = f.[Id];
  IF EXISTS (SELECT 1 FROM @failed WHERE [GroupKey] IS NOT NULL)
  BEGIN
    INSERT INTO @batchTokens ([Token]) SELECT DISTINCT [Token] FROM @failed WHERE [GroupKey] IS NOT NULL;
    UPDATE s
    SET [State] = 'ready', [Attempts] = CASE WHEN s.[Attempts] > 0 THEN s.[Attempts] - 1 ELSE 0 END, [ClaimToken] = NULL,
        [LeaseUntil] = NULL, [ClaimedAt] = NULL, [WorkerId] = NULL
    FROM ${jobs} AS s WITH (ROWLOCK)
    INNER JOIN @batchTokens AS b ON s.[ClaimToken] = b.[Token]
    WHERE s.[State] = 'leased' AND s.[GroupKey] IS NOT NULL;
    INSERT INTO @touched ([Queue], [GroupKey], [Token], [BlockId])
    SELECT f.[Queue], f.[GroupKey], f.[Token], ${blockingJob('f')}
    FROM @failed AS f LEFT JOIN ${settings} AS q ON q.[Queue] = f.[Queue]
    WHERE f.[GroupKey] IS NOT NULL
    GROUP BY f.[Queue], f.[GroupKey], f.[Token];
${settleGroups(jobs, groups)}
  END;`)}
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], f.[State],
  CASE WHEN f.[Id] IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${attempts} AS a WHERE a.[JobId] = i.[Id] AND a.[ClaimToken] = i.[Token] AND a.[Outcome] = 'failed') THEN 'already'
       ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @failed AS f ON f.[Id] = i.[Id];`,

    // @items OwnedJobList: leased but never started; the claim's attempt is given back. A
    // grouped job's group is settled as after a completion (released once no job of the batch
    // is leased, headed by its lowest unfinished job: the released one comes next).
    release: `${MSSQL_STORE_SESSION}${movedJobsTable('@released')}${TOUCHED_GROUPS}${atomically(`  UPDATE j
  SET [State] = 'ready', [Attempts] = CASE WHEN j.[Attempts] > 0 THEN j.[Attempts] - 1 ELSE 0 END, [ClaimToken] = NULL,
      [LeaseUntil] = NULL, [ClaimedAt] = NULL, [WorkerId] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], deleted.[ClaimToken]
  INTO @released ([Id], [Queue], [GroupKey], [Token])
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
  WHERE j.[State] = 'leased';
${settleMovedGroups('@released', jobs, groups)}`)}
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], CASE WHEN r.[Id] IS NOT NULL THEN 'ok' ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @released AS r ON r.[Id] = i.[Id];`,

    // @batch. One conditional statement: lock expired leases (skipping rows another reaper
    // holds; the locking read re-checks the predicate), void the token, record the attempt.
    // RunAt is kept: the job keeps its place, and its waiting age keeps counting.
    // A grouped job's batch siblings (leased with the same token) are reaped with it, whatever
    // their own lease says: the token is void, so its holder cannot go on with any of them
    // (the PostgreSQL store does the same). They wait for their row locks (ROWLOCK, no
    // READPAST): a sibling a worker is completing right now is settled by whichever of the two
    // takes the group row second. A batch runs in id order, so of its jobs still leased only the
    // lowest can have started: the others never ran, and are given back as a release would give
    // them (their attempt returned, their last error kept, ready even at their last attempt, no
    // attempt row). They are written twice (reaped, then given back: the reaper's locked read is
    // the seed's update in place, which cannot tell them apart), in one transaction, on rows it
    // already holds. Then the group is settled as after a failure.
    reap: `${MSSQL_STORE_SESSION}DECLARE @reaped TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [State] varchar(8) NOT NULL, [Attempt] int NOT NULL,
  [Token] uniqueidentifier NULL, [WorkerId] nvarchar(255) NULL, [ClaimedAt] datetime2(3) NULL, [LastError] nvarchar(max) NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [PriorError] nvarchar(max) NULL,
  [Unstarted] bit NOT NULL DEFAULT (0));
DECLARE @batchTokens TABLE ([Token] uniqueidentifier NOT NULL PRIMARY KEY);
${TOUCHED_GROUPS}${atomically(`  WITH expired AS (
    SELECT TOP (@batch) *
    FROM ${jobs} WITH (${CLAIM_HINTS})
    WHERE [State] = 'leased' AND [LeaseUntil] < SYSUTCDATETIME()
    ORDER BY [LeaseUntil]
  )
  UPDATE expired
  SET [State] = CASE WHEN [Attempts] >= [MaxAttempts] THEN 'dead' ELSE 'ready' END,
      [FinishedAt] = CASE WHEN [Attempts] >= [MaxAttempts] THEN SYSUTCDATETIME() ELSE NULL END,
      [LastError] = CONCAT(N'lease expired at ', STUFF(CONVERT(char(23), [LeaseUntil], 121), 11, 1, 'T'), N'Z (worker ', COALESCE([WorkerId], N'unknown'), N')'),
      [ClaimToken] = NULL, [LeaseUntil] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[State], inserted.[Attempts], deleted.[ClaimToken], deleted.[WorkerId],
         deleted.[ClaimedAt], inserted.[LastError], inserted.[GroupKey], deleted.[LastError]
  INTO @reaped ([Id], [Queue], [State], [Attempt], [Token], [WorkerId], [ClaimedAt], [LastError], [GroupKey], [PriorError]);
  IF EXISTS (SELECT 1 FROM @reaped WHERE [GroupKey] IS NOT NULL)
  BEGIN
    INSERT INTO @batchTokens ([Token]) SELECT DISTINCT [Token] FROM @reaped WHERE [GroupKey] IS NOT NULL AND [Token] IS NOT NULL;
    UPDATE s
    SET [State] = CASE WHEN s.[Attempts] >= s.[MaxAttempts] THEN 'dead' ELSE 'ready' END,
        [FinishedAt] = CASE WHEN s.[Attempts] >= s.[MaxAttempts] THEN SYSUTCDATETIME() ELSE NULL END,
        [LastError] = CONCAT(N'lease expired at ', STUFF(CONVERT(char(23), s.[LeaseUntil], 121), 11, 1, 'T'), N'Z (worker ',
                             COALESCE(s.[WorkerId], N'unknown'), N') with its group batch'),
        [ClaimToken] = NULL, [LeaseUntil] = NULL
    OUTPUT inserted.[Id], inserted.[Queue], inserted.[State], inserted.[Attempts], deleted.[ClaimToken], deleted.[WorkerId],
           deleted.[ClaimedAt], inserted.[LastError], inserted.[GroupKey], deleted.[LastError]
    INTO @reaped ([Id], [Queue], [State], [Attempt], [Token], [WorkerId], [ClaimedAt], [LastError], [GroupKey], [PriorError])
    FROM ${jobs} AS s WITH (ROWLOCK)
    INNER JOIN @batchTokens AS b ON s.[ClaimToken] = b.[Token]
    WHERE s.[State] = 'leased' AND s.[GroupKey] IS NOT NULL;
    UPDATE r SET [Unstarted] = 1
    FROM @reaped AS r
    WHERE r.[GroupKey] IS NOT NULL AND EXISTS (SELECT 1 FROM @reaped AS x WHERE x.[Token] = r.[Token] AND x.[Id] < r.[Id]);
    UPDATE j
    SET [State] = 'ready', [Attempts] = CASE WHEN j.[Attempts] > 0 THEN j.[Attempts] - 1 ELSE 0 END, [FinishedAt] = NULL,
        [LastError] = r.[PriorError], [ClaimedAt] = NULL, [WorkerId] = NULL
    FROM ${jobs} AS j WITH (ROWLOCK)
    INNER JOIN @reaped AS r ON r.[Id] = j.[Id]
    WHERE r.[Unstarted] = 1;
    UPDATE r SET [State] = 'ready', [Attempt] = CASE WHEN r.[Attempt] > 0 THEN r.[Attempt] - 1 ELSE 0 END
    FROM @reaped AS r
    WHERE r.[Unstarted] = 1;
  END;
  INSERT INTO ${attempts} WITH (ROWLOCK) ([JobId], [Queue], [Attempt], [Outcome], [Error], [Stack], [WorkerId], [ClaimToken], [StartedAt], [FinishedAt])
  SELECT [Id], [Queue], [Attempt], 'lease-expired', [LastError], NULL, [WorkerId], [Token], [ClaimedAt], SYSUTCDATETIME()
  FROM @reaped WHERE [Unstarted] = 0;
  IF EXISTS (SELECT 1 FROM @reaped WHERE [GroupKey] IS NOT NULL)
  BEGIN
    INSERT INTO @touched ([Queue], [GroupKey], [Token], [BlockId])
    SELECT r.[Queue], r.[GroupKey], r.[Token], ${blockingJob('r')}
    FROM @reaped AS r LEFT JOIN ${settings} AS q ON q.[Queue] = r.[Queue]
    WHERE r.[GroupKey] IS NOT NULL AND r.[Token] IS NOT NULL
    GROUP BY r.[Queue], r.[GroupKey], r.[Token];
${settleGroups(jobs, groups)}
  END;`)}
SELECT CAST([Id] AS varchar(20)) AS [Id], [Queue], [State], [Attempt] FROM @reaped;`,

    // A due delayed job counts: the next claim promotes and takes it; so do a claimable group and
    // a due waiting one (each a seek that stops at the first due row).
    hasClaimableWork: `${MSSQL_STORE_SESSION}SELECT CAST(CASE WHEN EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
) OR EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
) OR EXISTS (
  SELECT 1 FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND ${CLAIMABLE_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
) OR EXISTS (
  SELECT 1 FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND ${WAITING_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
) THEN 1 ELSE 0 END AS bit) AS [HasWork];`,

    // Each figure reads one filtered index that covers it (Attempts is included in the ready
    // index since migration 3, and in the delayed and group indexes), so the cost follows live
    // rows, not history. A delayed job that is due but not promoted yet (no claim since) counts
    // as ready: it is waiting. Ready rows not due yet only exist if written before version 4
    // (which moved them). Grouped jobs waiting behind their group's head (IX_Jobs_Group) count
    // as ready or delayed by their run time, as the ones a claim can take do.
    // READPAST: a monitoring read must never queue behind a producer's open transaction (as
    // PostgreSQL's MVCC reads never do); rows locked at that instant are simply not counted.
    stats: `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @groupedReady bigint, @groupedDelayed bigint, @groupedRetrying bigint, @groupedOldest datetime2(3);
SELECT @groupedReady = COUNT_BIG(CASE WHEN [State] <> 'leased' AND [RunAt] <= @now THEN 1 END),
       @groupedDelayed = COUNT_BIG(CASE WHEN [State] <> 'leased' AND [RunAt] > @now THEN 1 END),
       @groupedRetrying = COUNT_BIG(CASE WHEN [State] <> 'leased' AND [Attempts] > 0 THEN 1 END),
       @groupedOldest = MIN(CASE WHEN [State] <> 'leased' AND [RunAt] <= @now THEN [RunAt] END)
FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
WHERE [Queue] = @queue AND ${UNFINISHED_GROUPED};
SELECT
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [RunAt] <= @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= @now)
  + @groupedReady AS [Ready],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] > @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [RunAt] > @now)
  + @groupedDelayed AS [Delayed],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'leased') AS [Leased],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'leased' AND [LeaseUntil] < @now) AS [ExpiredLeases],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'dead') AS [Dead],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [Attempts] > 0)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [Attempts] > 0)
  + @groupedRetrying AS [Retrying],
  (SELECT COUNT_BIG(*) FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [Blocked] = 1) AS [BlockedGroups],
  (SELECT DATEDIFF_BIG(millisecond, MIN(w.[RunAt]), @now) FROM (
     SELECT MIN([RunAt]) AS [RunAt] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
     WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [RunAt] <= @now
     UNION ALL
     SELECT MIN([RunAt]) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
     WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= @now
     UNION ALL
     SELECT @groupedOldest) AS w) AS [OldestReadyAgeMs];`,

    getJob: `${MSSQL_STORE_SESSION}SELECT ${JOB_COLUMNS} FROM ${jobs} WHERE [Id] = @id;`,

    getAttempts: `${MSSQL_STORE_SESSION}SELECT [Attempt], [Outcome], [Error], [Stack], [WorkerId], [StartedAt], [FinishedAt]
FROM ${attempts} WHERE [JobId] = @id
UNION ALL
SELECT [Attempts], 'completed', NULL, NULL, [WorkerId], [ClaimedAt], [FinishedAt]
FROM ${jobs} WHERE [Id] = @id AND [State] = 'done'
ORDER BY [FinishedAt], [Attempt];`,

    // @queue, @afterId (null for the first page), @limit
    // ORDER BY names the table's column: the select list's [Id] is text and would sort 10 before 9.
    // ISNULL keeps the predicate a seek on IX_Jobs_Dead for every page (ids start at 1).
    listDead: `${MSSQL_STORE_SESSION}SELECT TOP (@limit) ${JOB_COLUMNS} FROM ${jobs} AS j
WHERE j.[Queue] = @queue AND j.[State] = 'dead' AND j.[Id] > ISNULL(@afterId, 0)
ORDER BY j.[Id];`,

    // @queue, @ids IdList. A retried job of an ordered group: see retryGroups.
    retryDead: `${MSSQL_STORE_SESSION}${RETRIED}${atomically(`  UPDATE j
  SET [State] = 'ready', [Attempts] = 0, [RunAt] = SYSUTCDATETIME(), [FinishedAt] = NULL, [ClaimToken] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[RunAt], inserted.[Priority]
  INTO @retried ([Id], [Queue], [GroupKey], [RunAt], [Priority])
  FROM ${jobs} AS j WITH (ROWLOCK) INNER JOIN @ids AS i ON i.[Id] = j.[Id]
  WHERE j.[Queue] = @queue AND j.[State] = 'dead';
${retryGroups}`)}
SELECT CAST([Id] AS varchar(20)) AS [Id] FROM @retried;`,

    // @queue, @afterId bigint (0 first), @batch. One keyset batch in Id order: lock escalation is
    // off (migration 1), so an unbounded UPDATE would hold key locks on every dead row (PK,
    // IX_Jobs_Dead, IX_Jobs_Claim) until it ends; the store loops, each batch its own
    // transaction. The ordered TOP is the UPDATE page's recipe ("use TOP together with
    // ORDER BY in a subselect", https://learn.microsoft.com/sql/t-sql/queries/update-transact-sql),
    // a range seek on IX_Jobs_Dead ([Queue], [Id]) that stops after @batch rows; Id order is the
    // order the other batched writers lock PK rows in. A job retried and dead again during the
    // loop keeps its Id, below @afterId, so it is not retried twice.
    retryAllDead: `${MSSQL_STORE_SESSION}${RETRIED}${atomically(`  WITH batch AS (
    SELECT TOP (@batch) *
    FROM ${jobs} WITH (ROWLOCK)
    WHERE [Queue] = @queue AND [State] = 'dead' AND [Id] > @afterId
    ORDER BY [Id]
  )
  UPDATE batch
  SET [State] = 'ready', [Attempts] = 0, [RunAt] = SYSUTCDATETIME(), [FinishedAt] = NULL, [ClaimToken] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[RunAt], inserted.[Priority]
  INTO @retried ([Id], [Queue], [GroupKey], [RunAt], [Priority]);
${retryGroups}`)}
SELECT CAST([Id] AS varchar(20)) AS [Id] FROM @retried ORDER BY [Id];`,

    // @queue, @olderThanMs bigint (0 for all), @batch. A group blocked by a purged job is
    // released: its row is locked first, then headed by its lowest unfinished job (a dirty read,
    // as in settleGroups), or deleted when it has none (purge, above).
    purgeDead: purge(''),
    // The same for the dead jobs among @ids (IdList, at most @batch of them): a seek per id.
    purgeDeadIds: purge('\n    AND [Id] IN (SELECT i.[Id] FROM @ids AS i)'),

    // @doneMs, @keyMs, @deadMs (null: keep dead jobs), @batch; all bigint milliseconds. At most
    // @batch rows in all: each DELETE takes what the ones before it left of the budget, so a
    // short answer means nothing old is left. Each DELETE is its own autocommit statement with
    // a predicate a FinishedAt-led filtered index can answer as one range: keyless done rows,
    // keyed done rows (kept until the key window passes too), dead rows. A dead job that blocks
    // its ordered group stays until it is retried or purged: deleting it would leave the group
    // blocked by nothing (IX_Jobs_DeadFinished carries Queue and GroupKey for this check).
    cleanup: `${MSSQL_STORE_SESSION}DECLARE @deleted int = 0;
DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @doneBefore datetime2(3) = ${shiftedNow('@doneMs', -1, '@now')};
DECLARE @keyBefore datetime2(3) = ${shiftedNow('@keyMs', -1, '@now')};
DECLARE @keyedDoneBefore datetime2(3) = CASE WHEN @keyBefore < @doneBefore THEN @keyBefore ELSE @doneBefore END;
DECLARE @deadBefore datetime2(3) = ${shiftedNow('@deadMs', -1, '@now')};
DELETE TOP (@batch) FROM ${jobs} WITH (ROWLOCK)
WHERE [State] = 'done' AND [IdempotencyKey] IS NULL AND [FinishedAt] < @doneBefore;
SET @deleted = @@ROWCOUNT;
IF @deleted < @batch
BEGIN
  DELETE TOP (@batch - @deleted) FROM ${jobs} WITH (ROWLOCK)
  WHERE [State] = 'done' AND [IdempotencyKey] IS NOT NULL AND [FinishedAt] < @keyedDoneBefore;
  SET @deleted = @deleted + @@ROWCOUNT;
END;
IF @deadMs IS NOT NULL AND @deleted < @batch
BEGIN
  DELETE TOP (@batch - @deleted) d FROM ${jobs} AS d WITH (ROWLOCK)
  WHERE d.[State] = 'dead' AND d.[FinishedAt] < @deadBefore
    AND (d.[IdempotencyKey] IS NULL OR d.[FinishedAt] < @keyBefore)
    AND (d.[GroupKey] IS NULL OR NOT EXISTS (
      SELECT 1 FROM ${groups} AS g
      WHERE g.[Blocked] = 1 AND g.[Queue] = d.[Queue] AND g.[GroupKey] = d.[GroupKey] AND g.[HeadId] = d.[Id]));
  SET @deleted = @deleted + @@ROWCOUNT;
END;
SELECT @deleted AS [Deleted];`,

    // ---- browsing jobs and counting outcomes (the dashboard) ---------------------------------

    // Each listing reads its page of ids through the filtered index that already serves the
    // state, by keyset (after the last job listed, never OFFSET), its filter named literally, then
    // reads those rows only (listedJobs). Every one takes @queue, @limit (1..500, checked by the
    // store), and the cursor's position: @part (null for a first page; 1 the ungrouped part, 2
    // the grouped one), @keyInt (priority), @keyAt (run time, lease end or finish time), @keyText
    // (group key), @keyId. A first page starts from a position before every job.
    // Every read carries LIST_HINTS: rows locked at this instant are left out of the page.

    // Claim order through IX_Jobs_Claim (priority descending, run time, id; the position's
    // priority from 2^31 - 1 for a first page), then the grouped part.
    listReadyJobs: `${MSSQL_STORE_SESSION}${LIST_PAGE}${ungroupedPart(
      jobs,
      READY_UNGROUPED,
      `@fromInt = ISNULL(@keyInt, 2147483647), @fromAt = ISNULL(@keyAt, ${EARLIEST}), @fromId = ISNULL(@keyId, 0)`,
      [
        { column: 'Priority', desc: true, from: '@fromInt' },
        { column: 'RunAt', from: '@fromAt' },
        { column: 'Id', from: '@fromId' },
      ],
    )}${groupedPart(jobs, 'ready')}${listedJobs(jobs, 'ready')}`,

    // Run time and id through IX_Jobs_Delayed, then the grouped part.
    listDelayedJobs: `${MSSQL_STORE_SESSION}${LIST_PAGE}${ungroupedPart(
      jobs,
      DELAYED_UNGROUPED,
      `@fromAt = ISNULL(@keyAt, ${EARLIEST}), @fromId = ISNULL(@keyId, 0)`,
      [
        { column: 'RunAt', from: '@fromAt' },
        { column: 'Id', from: '@fromId' },
      ],
    )}${groupedPart(jobs, 'delayed')}${listedJobs(jobs, 'delayed')}`,

    // Lease end and id through IX_Jobs_Leased ([LeaseUntil], [Queue], then Id as every
    // nonclustered index carries the clustered key): with one queue, its order is (LeaseUntil, Id),
    // so ORDER BY names Queue too and needs no sort. The index is led by LeaseUntil (the reaper's
    // order), so the queue is checked in it: leased rows are as many as running handlers.
    listLeasedJobs: `${MSSQL_STORE_SESSION}${LIST_PAGE}SELECT @fromAt = ISNULL(@keyAt, ${EARLIEST}), @fromId = ISNULL(@keyId, 0);
${keysetWalk(
  jobs,
  1,
  LEASED_JOB,
  [
    { column: 'LeaseUntil', from: '@fromAt' },
    { column: 'Id', from: '@fromId' },
  ],
  '[LeaseUntil], [Queue], [Id]',
)}
${listedJobs(jobs, 'leased')}`,

    // Newest first among the DONE_SCAN_LIMIT most recent completions of all queues
    // (recentCompletions: done rows are not indexed by queue), the queue's kept by a seek per
    // completion until the page is full, from the position (FinishedAt, Id) down; ties on
    // FinishedAt (one completion statement's jobs) are passed over in the window, never looked up.
    // A second result, Scanned: the window's size when the page is not full (DONE_SCAN_LIMIT: the
    // queue may have older done jobs that no page lists).
    listDoneJobs: `${MSSQL_STORE_SESSION}${LIST_PAGE}DECLARE @scanned bigint = 0;
SELECT @fromAt = ISNULL(@keyAt, ${LATEST}), @fromId = ISNULL(@keyId, ${BIGINT_MAX});
INSERT INTO @page ([Seq], [Part], [Id], [KeyInt], [KeyAt], [KeyText])
SELECT TOP (@want) ROW_NUMBER() OVER (ORDER BY w.[FinishedAt] DESC, w.[Id] DESC), 1, w.[Id], NULL, w.[FinishedAt], NULL
FROM ${recentCompletions(jobs)} AS w
INNER JOIN ${jobs} AS j WITH (FORCESEEK, ${LIST_HINTS}) ON j.[Id] = w.[Id]
WHERE j.[Queue] = @queue AND j.[State] = 'done' AND w.[FinishedAt] <= @fromAt AND (w.[FinishedAt] < @fromAt OR w.[Id] < @fromId)
ORDER BY w.[FinishedAt] DESC, w.[Id] DESC;
SET @got = @@ROWCOUNT;
IF @got < @want
  SET @scanned = (SELECT COUNT_BIG(*) FROM ${recentCompletions(jobs)} AS c);
${listedJobs(jobs, 'done')}
SELECT @scanned AS [Scanned];`,

    // Newest first (Id descending) through IX_Jobs_Dead, a backward range from the position.
    listDeadJobs: `${MSSQL_STORE_SESSION}${LIST_PAGE}SELECT @fromId = ISNULL(@keyId, ${BIGINT_MAX});
${keysetWalk(jobs, 1, DEAD_JOB, [{ column: 'Id', desc: true, from: '@fromId' }])}
${listedJobs(jobs, 'dead')}`,

    // @counts ThroughputCountList (one row per queue). Adds each queue's counts into its bucket of
    // the current minute (the database clock, rounded to datetime2(3) as readThroughput reads it),
    // in one transaction, a queue at a time in queue order (the codebase's upsert, as
    // recordQueueSetting; no MERGE). UPDLOCK, HOLDLOCK keep the bucket's key, or when it is missing
    // the range it would go in (RangeS-U), until commit: a concurrent flush of the same bucket waits
    // there (RangeS-U is incompatible with RangeS-U), then finds the row the first one inserted and
    // adds to it, so no increment is lost, none is counted twice (a deadlock victim's transaction
    // is rolled back whole before run() sends it again), and no insert meets a duplicate key. Every
    // flush takes its buckets' locks in key order (one minute, ascending queues), so two flushes
    // naming the same queues never wait on each other in a cycle.
    recordThroughput: `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @minute datetime2(3) = ${minuteStart('@now')};
DECLARE @queue nvarchar(128) = (SELECT MIN([Queue]) FROM @counts), @completed bigint, @failed bigint, @dead bigint;
${atomically(`  WHILE @queue IS NOT NULL
  BEGIN
    SELECT @completed = [Completed], @failed = [Failed], @dead = [Dead] FROM @counts WHERE [Queue] = @queue;
    UPDATE ${throughput} WITH (UPDLOCK, HOLDLOCK)
    SET [Completed] = [Completed] + @completed, [Failed] = [Failed] + @failed, [Dead] = [Dead] + @dead
    WHERE [Minute] = @minute AND [Queue] = @queue;
    IF @@ROWCOUNT = 0
      INSERT INTO ${throughput} ([Minute], [Queue], [Completed], [Failed], [Dead])
      VALUES (@minute, @queue, @completed, @failed, @dead);
    SET @queue = (SELECT MIN([Queue]) FROM @counts WHERE [Queue] > @queue);
  END;`)}`,

    // @minutes (1..1440, checked by the store). The database's now, then the buckets of the last
    // @minutes minutes, the current one included, oldest first: one range of PK_Throughput.
    readThroughput: `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @since datetime2(3) = ${minuteStart('@now', ' - @minutes + 1')};
SELECT @now AS [Now];
SELECT [Minute], [Queue], [Completed], [Failed], [Dead]
FROM ${throughput}
WHERE [Minute] >= @since
ORDER BY [Minute], [Queue];`,

    // @retentionMs bigint, @batch. The oldest buckets past the retention, at most @batch of them:
    // one range at the start of PK_Throughput.
    cleanupThroughput: `${MSSQL_STORE_SESSION}DELETE TOP (@batch) FROM ${throughput} WITH (ROWLOCK)
WHERE [Minute] < ${shiftedNow('@retentionMs', -1)};`,

    // ---- ordered groups ----------------------------------------------------------------------

    // @queue, @afterKey (null: from the first), @limit. Blocked groups by key (IX_Groups_Blocked),
    // each with the dead job that blocks it, its last error and when it died.
    listBlockedGroups: `${MSSQL_STORE_SESSION}SELECT TOP (@limit) g.[GroupKey], CAST(g.[HeadId] AS varchar(20)) AS [JobId],
  j.[LastError], j.[FinishedAt]
FROM ${groups} AS g
LEFT JOIN ${jobs} AS j ON j.[Id] = g.[HeadId]
WHERE g.[Queue] = @queue AND g.[Blocked] = 1 AND g.[GroupKey] > ISNULL(@afterKey, N'')
ORDER BY g.[GroupKey];`,

    // @rowQueue, @rowKey (null: from the start), @orphanQueue, @orphanKey (likewise), @limit.
    // The repair sweep's first look, taking no lock and waiting for none (see repairGroup for the
    // second): up to @limit group rows after the row cursor (rows in use are skipped, and seen
    // on a later pass) checked against their jobs, and up to @limit groups with unfinished jobs
    // after the orphan cursor (a loose index scan on IX_Jobs_Group, two seeks per group) checked
    // for a row. The jobs are read dirty, as the transitions read them. Returns what looks wrong
    // (Kind 'row' with the row's version, or 'orphan') and the two cursors to resume from
    // (Kind 'rows' and 'orphans'; null keys: start over).
    findGroupProblems: `${MSSQL_STORE_SESSION}DECLARE @found TABLE (
  [Kind] varchar(8) NOT NULL, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Version] bigint NULL, [Problem] nvarchar(400) NULL);
DECLARE @page TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL, [HeadId] bigint NULL,
  [HeldToken] uniqueidentifier NULL, [Blocked] bit NOT NULL, [Version] bigint NOT NULL,
  PRIMARY KEY ([Queue], [GroupKey]));
DECLARE @q nvarchar(128) = @orphanQueue, @k nvarchar(255) = @orphanKey, @nextQueue nvarchar(128), @nextKey nvarchar(255);
DECLARE @walked int = 0, @rowCursorQueue nvarchar(128), @rowCursorKey nvarchar(255);
INSERT INTO @page ([Queue], [GroupKey], [HeadId], [HeldToken], [Blocked], [Version])
SELECT TOP (@limit) p.[Queue], p.[GroupKey], p.[HeadId], p.[HeldToken], p.[Blocked], p.[Version] FROM (
  SELECT a.* FROM (
    SELECT TOP (@limit) [Queue], [GroupKey], [HeadId], [HeldToken], [Blocked], CAST([RowVersion] AS bigint) AS [Version]
    FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] = @rowQueue AND [GroupKey] > @rowKey
    ORDER BY [GroupKey]) AS a
  UNION ALL
  SELECT b.* FROM (
    SELECT TOP (@limit) [Queue], [GroupKey], [HeadId], [HeldToken], [Blocked], CAST([RowVersion] AS bigint) AS [Version]
    FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] > ISNULL(@rowQueue, N'')
    ORDER BY [Queue], [GroupKey]) AS b
) AS p
ORDER BY p.[Queue], p.[GroupKey];
IF (SELECT COUNT(*) FROM @page) >= @limit
  SELECT TOP (1) @rowCursorQueue = [Queue], @rowCursorKey = [GroupKey] FROM @page ORDER BY [Queue] DESC, [GroupKey] DESC;
INSERT INTO @found ([Kind], [Queue], [GroupKey], [Version], [Problem])
SELECT 'row', p.[Queue], p.[GroupKey], p.[Version], x.[Problem]
FROM @page AS p
OUTER APPLY ${firstUnfinished(jobs, 'p.[Queue]', 'p.[GroupKey]', 'u.[Id]')} AS n
CROSS APPLY (SELECT ${groupProblem(jobs, 'p', 'n.[Id]')} AS [Problem]) AS x
WHERE x.[Problem] IS NOT NULL;
WHILE @walked < @limit
BEGIN
  SET @nextQueue = NULL;
  SELECT TOP (1) @nextQueue = [Queue], @nextKey = [GroupKey]
  FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @q AND [GroupKey] > @k AND ${UNFINISHED_GROUPED}
  ORDER BY [GroupKey];
  IF @nextQueue IS NULL
    SELECT TOP (1) @nextQueue = [Queue], @nextKey = [GroupKey]
    FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] > ISNULL(@q, N'') AND ${UNFINISHED_GROUPED}
    ORDER BY [Queue], [GroupKey];
  IF @nextQueue IS NULL BREAK;
  SET @walked = @walked + 1;
  SET @q = @nextQueue;
  SET @k = @nextKey;
  IF NOT EXISTS (SELECT 1 FROM ${groups} WITH (READUNCOMMITTED) WHERE [Queue] = @q AND [GroupKey] = @k)
    INSERT INTO @found ([Kind], [Queue], [GroupKey], [Version], [Problem])
    VALUES ('orphan', @q, @k, NULL, N'unfinished jobs but no group row');
END;
SELECT [Kind], [Queue], [GroupKey], CAST([Version] AS varchar(20)) AS [Version], [Problem] FROM @found
UNION ALL
SELECT 'rows', @rowCursorQueue, @rowCursorKey, NULL, NULL
UNION ALL
SELECT 'orphans', CASE WHEN @walked >= @limit THEN @q END, CASE WHEN @walked >= @limit THEN @k END, NULL, NULL;`,

    // @queue, @groupKey, @version (bigint; null for a group found without a row). The repair
    // sweep's second look at one group findGroupProblems reported, a moment later, in its own
    // transaction: a row is fixed only if it is unchanged since (its RowVersion; a transition
    // that was under way when it was first read has changed it since) and not in use (UPDLOCK,
    // READPAST), and still wrong by the jobs (read dirty, as the transitions read them). The fix
    // is the state the transitions would have left: headed by the lowest unfinished job (held by
    // its token if that job is leased), neither blocked nor held otherwise; a row with no
    // unfinished job is deleted. A missing row is created under the group's lock (not waited
    // for: a producer holding it is creating the row). Returns the problem fixed, or null.
    // An idle group headed by a job that is gone (a producer's job a transition or a claim read
    // uncommitted as the next head, then rolled back) is fixed without a report: the design
    // allows it (groupClaim, step 4), and the group's next claim would have fixed it as well.
    repairGroup: `${MSSQL_STORE_SESSION}DECLARE @problem nvarchar(400), @expected bit = 0, @seen bit = 0, @headId bigint, @held uniqueidentifier, @blocked bit;
DECLARE @firstId bigint, @firstAt datetime2(3), @firstPriority int, @firstState varchar(8), @firstToken uniqueidentifier;
DECLARE @lock int, @resource nvarchar(255);
${atomically(`  IF @version IS NOT NULL
    SELECT @seen = 1, @headId = [HeadId], @held = [HeldToken], @blocked = [Blocked]
    FROM ${groups} WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] = @queue AND [GroupKey] = @groupKey AND CAST([RowVersion] AS bigint) = @version;
  SELECT TOP (1) @firstId = [Id], @firstAt = [RunAt], @firstPriority = [Priority], @firstState = [State], @firstToken = [ClaimToken]
  FROM ${jobs} WITH (READUNCOMMITTED)
  WHERE [Queue] = @queue AND [GroupKey] = @groupKey AND ${UNFINISHED_GROUPED}
  ORDER BY [Id];
  IF @seen = 1
  BEGIN
    SELECT @problem = ${groupProblem(jobs, null, '@firstId')};
    IF @problem IS NOT NULL AND @held IS NULL AND @blocked = 0 AND @headId IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM ${jobs} WITH (READUNCOMMITTED) WHERE [Id] = @headId)
      SET @expected = 1;
    IF @problem IS NOT NULL AND @firstId IS NULL
      DELETE FROM ${groups} WITH (ROWLOCK) WHERE [Queue] = @queue AND [GroupKey] = @groupKey;
    ELSE IF @problem IS NOT NULL
      UPDATE ${groups} WITH (ROWLOCK)
      SET [HeldToken] = CASE WHEN @firstState = 'leased' THEN @firstToken END, [Blocked] = 0, [HeadId] = @firstId,
          [HeadReadyAt] = @firstAt, [HeadPriority] = @firstPriority, [Waiting] = ${waitingFor('@firstAt')},
          [UpdatedAt] = SYSUTCDATETIME()
      WHERE [Queue] = @queue AND [GroupKey] = @groupKey;
  END
  ELSE IF @version IS NULL AND @firstId IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM ${groups} WITH (READUNCOMMITTED) WHERE [Queue] = @queue AND [GroupKey] = @groupKey)
  BEGIN
    SET @resource = ${groupLockResource(schema, '@queue', '@groupKey')};
    EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction', @LockTimeout = 0;
    IF @lock >= 0 AND NOT EXISTS (SELECT 1 FROM ${groups} WITH (READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [GroupKey] = @groupKey)
    BEGIN
      INSERT INTO ${groups} WITH (ROWLOCK) ([Queue], [GroupKey], [HeadId], [HeadReadyAt], [HeadPriority], [Waiting], [HeldToken])
      VALUES (@queue, @groupKey, @firstId, @firstAt, @firstPriority, ${waitingFor('@firstAt')},
              CASE WHEN @firstState = 'leased' THEN @firstToken END);
      SET @problem = CONCAT(N'unfinished jobs but no group row; created it with head ', @firstId);
    END;
  END;`)}
SELECT CASE WHEN @expected = 0 THEN @problem END AS [Problem];`,

    ping: 'SELECT 1 AS [Ok];',

    // ---- health and measurements --------------------------------------------------------

    // @windowMs bigint, @repeated int. Every queue in one batch, for scrapes. Each live figure
    // reads one filtered index that covers it (ready, leased, dead), so done rows are never
    // read. Attempts have no index on FinishedAt alone: their queues are walked on
    // IX_Attempts_Recent ([Queue], [FinishedAt]) INCLUDE ([Outcome]) one MIN seek at a time, and
    // each queue's recent attempts are one range seek on it. READPAST, as in stats: a monitoring
    // read never queues behind a producer's open transaction; rows locked at that instant are
    // simply not counted.
    // Waiting jobs (ready and delayed, grouped ones behind their head too) count as ready when
    // due, delayed when not, as in stats. Blocked groups per queue: IX_Groups_Blocked.
    // Failures: a waiting job has failed [Attempts] times, a leased one [Attempts] - 1 times.
    queueHealth: `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @since datetime2(3) = DATEADD(millisecond, -CAST(@windowMs % 1000 AS int), DATEADD(second, -CAST(@windowMs / 1000 AS int), @now));
DECLARE @ready TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [Ready] bigint NOT NULL,
  [Delayed] bigint NOT NULL, [Retrying] bigint NOT NULL, [Repeated] bigint NOT NULL, [OldestDue] datetime2(3) NULL);
DECLARE @leased TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [Leased] bigint NOT NULL,
  [Expired] bigint NOT NULL, [Repeated] bigint NOT NULL);
DECLARE @dead TABLE ([Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [Dead] bigint NOT NULL);
DECLARE @blocked TABLE ([Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [Blocked] bigint NOT NULL);
DECLARE @failures TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [Failed] bigint NOT NULL,
  [LeaseExpired] bigint NOT NULL);
INSERT INTO @ready ([Queue], [Ready], [Delayed], [Retrying], [Repeated], [OldestDue])
SELECT [Queue], COUNT_BIG(CASE WHEN [RunAt] <= @now THEN 1 END), COUNT_BIG(CASE WHEN [RunAt] > @now THEN 1 END),
       COUNT_BIG(CASE WHEN [Attempts] > 0 THEN 1 END), COUNT_BIG(CASE WHEN [Attempts] >= @repeated THEN 1 END),
       MIN(CASE WHEN [RunAt] <= @now THEN [RunAt] END)
FROM (SELECT [Queue], [RunAt], [Attempts] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [State] = 'ready' AND [GroupKey] IS NULL
      UNION ALL
      SELECT [Queue], [RunAt], [Attempts] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [State] = 'delayed' AND [GroupKey] IS NULL
      UNION ALL
      SELECT [Queue], [RunAt], [Attempts] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
      WHERE ${UNFINISHED_GROUPED} AND [State] <> 'leased') AS w
GROUP BY [Queue];
INSERT INTO @leased ([Queue], [Leased], [Expired], [Repeated])
SELECT [Queue], COUNT_BIG(*), COUNT_BIG(CASE WHEN [LeaseUntil] < @now THEN 1 END), COUNT_BIG(CASE WHEN [Attempts] > @repeated THEN 1 END)
FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
WHERE [State] = 'leased'
GROUP BY [Queue];
INSERT INTO @dead ([Queue], [Dead])
SELECT [Queue], COUNT_BIG(*)
FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
WHERE [State] = 'dead'
GROUP BY [Queue];
INSERT INTO @blocked ([Queue], [Blocked])
SELECT [Queue], COUNT_BIG(*)
FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
WHERE [Blocked] = 1
GROUP BY [Queue];
DECLARE @queue nvarchar(128) = (SELECT MIN([Queue]) FROM ${attempts} WITH (READPAST, READCOMMITTEDLOCK));
WHILE @queue IS NOT NULL
BEGIN
  INSERT INTO @failures ([Queue], [Failed], [LeaseExpired])
  SELECT @queue, COUNT_BIG(CASE WHEN [Outcome] = 'failed' THEN 1 END), COUNT_BIG(CASE WHEN [Outcome] = 'lease-expired' THEN 1 END)
  FROM ${attempts} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [FinishedAt] > @since
  HAVING COUNT_BIG(*) > 0;
  SET @queue = (SELECT MIN([Queue]) FROM ${attempts} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] > @queue);
END;
SELECT q.[Queue], ISNULL(r.[Ready], 0) AS [Ready], ISNULL(r.[Delayed], 0) AS [Delayed], ISNULL(l.[Leased], 0) AS [Leased],
       ISNULL(l.[Expired], 0) AS [ExpiredLeases], ISNULL(d.[Dead], 0) AS [Dead], ISNULL(r.[Retrying], 0) AS [Retrying],
       ISNULL(b.[Blocked], 0) AS [BlockedGroups],
       ISNULL(r.[Repeated], 0) + ISNULL(l.[Repeated], 0) AS [RepeatedlyFailing],
       ISNULL(f.[Failed], 0) AS [RecentFailures], ISNULL(f.[LeaseExpired], 0) AS [RecentLeaseExpiries],
       ISNULL(DATEDIFF_BIG(millisecond, r.[OldestDue], @now), 0) AS [OldestReadyAgeMs]
FROM (SELECT [Queue] FROM @ready UNION SELECT [Queue] FROM @leased UNION SELECT [Queue] FROM @dead
      UNION SELECT [Queue] FROM @failures UNION SELECT [Queue] FROM @blocked) AS q
LEFT JOIN @ready AS r ON r.[Queue] = q.[Queue]
LEFT JOIN @leased AS l ON l.[Queue] = q.[Queue]
LEFT JOIN @dead AS d ON d.[Queue] = q.[Queue]
LEFT JOIN @blocked AS b ON b.[Queue] = q.[Queue]
LEFT JOIN @failures AS f ON f.[Queue] = q.[Queue]
ORDER BY q.[Queue];`,

    // ---- recurring jobs (issue 13) ----

    // The scheduler's idle poll, one autocommit statement: the database's now, and the ms until
    // the earliest unpaused schedule is due (<= 0: due; null: none). MIN reads one end of
    // IX_Schedules_Due (its filter named literally). Both times are datetime2(3), so the
    // difference is exact in ms. READPAST: a row another instance is firing, or that an
    // application's transaction holds, never makes the poll wait (the fire skips it too), and is
    // read again at the next poll.
    scheduleDueIn: `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT @now AS [Now], DATEDIFF_BIG(millisecond, @now, MIN([NextRunAt])) AS [DueInMs]
FROM ${schedules} WITH (READPAST, READCOMMITTEDLOCK)
WHERE ${UNPAUSED_SCHEDULE};`,

    // @limit. In fireDueSchedules' transaction: the due schedules no other session holds,
    // earliest first (the key order of IX_Schedules_Due, so the seek stops after TOP rows), with
    // the claim hints (CLAIM_HINTS: no ROWLOCK beside READCOMMITTEDLOCK, see there). UPDLOCK
    // keeps each row until the transaction ends ("update locks are to be taken and held until
    // the transaction completes", Table hints), so two instances never hold one schedule: the
    // second reads past it, and once the first commits, the row's NextRunAt is after that
    // round's now. @now is the round's time, handed to plan and written by scheduleAdvance.
    scheduleLockDue: `${MSSQL_STORE_TRANSACTION_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT TOP (@limit) ${SCHEDULE_COLUMNS}, @now AS [Now]
FROM ${schedules} WITH (${CLAIM_HINTS})
WHERE ${UNPAUSED_SCHEDULE} AND [NextRunAt] <= @now
ORDER BY [NextRunAt], [Id];`,

    // @items ScheduleAdvanceList (the schedules scheduleLockDue locked), @now (its round's time).
    // A firing that enqueued no job (every missed tick skipped) moves NextRunAt only: the last
    // run and its tick are those of the last job enqueued. FORCESEEK: one seek per item, so the
    // statement touches no row but those this transaction already holds.
    scheduleAdvance: `${MSSQL_STORE_TRANSACTION_SESSION}UPDATE s
SET [NextRunAt] = a.[NextRunAt],
    [LastRunAt] = CASE WHEN a.[Fired] = 1 THEN @now ELSE s.[LastRunAt] END,
    [LastTick] = CASE WHEN a.[Fired] = 1 THEN a.[LastTick] ELSE s.[LastTick] END,
    [UpdatedAt] = @now
FROM ${schedules} AS s WITH (ROWLOCK, FORCESEEK)
INNER JOIN @items AS a ON s.[Id] = a.[Id];`,

    // @items ScheduleUpsertList (one row per id), @prune (a source, or null). One transaction:
    // first each id's application lock (scheduleLockResource), in resource order, the same in
    // every session, so concurrent boots upserting the same schedules serialize per id and never
    // deadlock on each other; then the UPDATE of the ids that exist and the INSERT of the others
    // (no MERGE: its insert branch races a concurrent insert of the same key unless it holds a
    // serializable range lock). Why application locks and not UPDLOCK, HOLDLOCK on the existence
    // check: the range lock of a missing id covers the gap up to the next existing id, so
    // sessions with different sets of new ids would lock shared gaps in their own orders (the
    // deadlock of review C1). Only upserts insert schedules, so under the locks the check needs
    // no range lock; READCOMMITTEDLOCK makes it wait for an uncommitted delete of the id (also
    // under READ_COMMITTED_SNAPSHOT, where a plain read would see the version before it).
    // An existing schedule keeps its NextRunAt unless its cron or time zone changed (the SET
    // expressions read the row as it was before the UPDATE), and its paused flag always.
    // FORCESEEK: one seek per item, so the UPDATE locks no other schedule (a scan would wait on
    // a row a fire holds). Then, with @prune, the schedules of that source not in @items go.
    scheduleUpsert: `${MSSQL_STORE_SESSION}DECLARE @resource nvarchar(255), @lock int, @refused nvarchar(2048), @seq int = 1, @lockCount int;
DECLARE @locks TABLE ([Seq] int NOT NULL PRIMARY KEY, [Resource] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL);
INSERT INTO @locks ([Seq], [Resource])
SELECT ROW_NUMBER() OVER (ORDER BY r.[Resource]), r.[Resource]
FROM (SELECT DISTINCT ${scheduleLockResource(schema, 'i.[Id]')} AS [Resource] FROM @items AS i) AS r;
SET @lockCount = @@ROWCOUNT;
${atomically(`  WHILE @seq <= @lockCount
  BEGIN
    SET @resource = (SELECT [Resource] FROM @locks WHERE [Seq] = @seq);
${takeKeyLock('    ', 'schedule')}
    SET @seq = @seq + 1;
  END;
  UPDATE s
  SET [Queue] = i.[Queue], [Payload] = i.[Payload], [Options] = i.[Options], [CatchUp] = i.[CatchUp], [Source] = i.[Source],
      [NextRunAt] = CASE WHEN s.[Cron] <> i.[Cron] OR s.[Timezone] <> i.[Timezone] THEN i.[NextRunAt] ELSE s.[NextRunAt] END,
      [Cron] = i.[Cron], [Timezone] = i.[Timezone], [UpdatedAt] = SYSUTCDATETIME()
  FROM ${schedules} AS s WITH (ROWLOCK, FORCESEEK)
  INNER JOIN @items AS i ON s.[Id] = i.[Id];
  INSERT INTO ${schedules} WITH (ROWLOCK) ([Id], [Queue], [Cron], [Timezone], [Payload], [Options], [CatchUp], [Source], [NextRunAt])
  SELECT i.[Id], i.[Queue], i.[Cron], i.[Timezone], i.[Payload], i.[Options], i.[CatchUp], i.[Source], i.[NextRunAt]
  FROM @items AS i
  WHERE NOT EXISTS (SELECT 1 FROM ${schedules} AS e WITH (READCOMMITTEDLOCK) WHERE e.[Id] = i.[Id]);
  IF @prune IS NOT NULL
    DELETE s FROM ${schedules} AS s WITH (ROWLOCK)
    WHERE s.[Source] = @prune AND NOT EXISTS (SELECT 1 FROM @items AS i WHERE i.[Id] = s.[Id]);`)}`,

    // @id
    scheduleGet: `${MSSQL_STORE_SESSION}SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} WHERE [Id] = @id;`,

    scheduleList: `${MSSQL_STORE_SESSION}SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} ORDER BY [Id];`,

    // @id. Whether it existed (a fire holding the row is waited for; the schedule is then gone).
    scheduleDelete: `${MSSQL_STORE_SESSION}DELETE FROM ${schedules} WITH (ROWLOCK) WHERE [Id] = @id;
SELECT CAST(CASE WHEN @@ROWCOUNT > 0 THEN 1 ELSE 0 END AS bit) AS [Existed];`,

    // @id, @paused, @nextRunAt (for a resume). Only a paused schedule that resumes takes
    // @nextRunAt (it does not catch up its paused period); pausing, or resuming one that runs,
    // keeps the time it has, so a tick due right now is not skipped.
    schedulePause: `${MSSQL_STORE_SESSION}UPDATE ${schedules} WITH (ROWLOCK)
SET [NextRunAt] = CASE WHEN [Paused] = 1 AND @paused = 0 THEN @nextRunAt ELSE [NextRunAt] END,
    [Paused] = @paused, [UpdatedAt] = SYSUTCDATETIME()
WHERE [Id] = @id;
SELECT CAST(CASE WHEN @@ROWCOUNT > 0 THEN 1 ELSE 0 END AS bit) AS [Existed];`,
  };
}
