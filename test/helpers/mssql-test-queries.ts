import { quoteMssqlIdentifier } from '../../lib/src/store/mssql/mssql.identifiers.js';

/**
 * Every T-SQL statement the SQL Server tests send themselves (the store's own are in
 * lib/src/store/mssql), one function each, so that test/unit/tsql-grammar.spec.ts parses all
 * of them: none of this runs on the machines without SQL Server, where that gate is the only
 * check they get. Values are parameters; only schema names (validated by the store's rule)
 * are spliced in, bracket-quoted.
 *
 * Loaded by the worker processes too (test/workers), so it imports nothing from vitest.
 */

const JOBS = (schema: string) => `${quoteMssqlIdentifier(schema)}.[Jobs]`;

/** The database a connection is in, and the row-versioning settings the suite depends on. */
export const DATABASE_SETTINGS = `SELECT DB_NAME() AS [Database],
  CAST(d.[is_read_committed_snapshot_on] AS int) AS [ReadCommittedSnapshot],
  d.[snapshot_isolation_state_desc] AS [SnapshotIsolation],
  CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)) AS [ProductVersion]
FROM sys.databases AS d
WHERE d.[database_id] = DB_ID();`;

/** Whether this login may read the lock and extended-event DMVs. */
export const VIEW_SERVER_STATE = `SELECT HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') AS [Granted];`;

/**
 * The session a request ran on, its open transactions and its IMPLICIT_TRANSACTIONS bit. Reads no
 * table (review 2, R2-2): under IMPLICIT_TRANSACTIONS ON a SELECT from a table begins a transaction,
 * except "SELECT statements that do not select from a table"
 * (https://learn.microsoft.com/sql/t-sql/statements/set-implicit-transactions-transact-sql), and a
 * DMV may count as one, so the probe would open the very transaction it measures. What only a
 * DMV shows is read from another connection by spid (SESSION_OF_SPID).
 */
export const SESSION_STATE = `SELECT @@SPID AS [Spid], @@TRANCOUNT AS [TranCount], @@OPTIONS & 2 AS [ImplicitTransactions];`;

/**
 * @spid: that session's deadlock priority and open transactions, as sys.dm_exec_sessions shows
 * them, read from another connection (SESSION_STATE must stay table-free). No row when the session
 * is gone, or when the login lacks VIEW SERVER STATE: without it "everyone can see their own
 * session information" only.
 */
export const SESSION_OF_SPID = `SELECT [deadlock_priority] AS [DeadlockPriority], [open_transaction_count] AS [OpenTransactions]
FROM sys.dm_exec_sessions WHERE [session_id] = @spid;`;

/**
 * Session state an application can leave on a pooled connection. Sent with `batch()` (a plain
 * SQL batch), so it outlives the request: inside sp_executesql it would revert at once.
 */
export const LEAVE_ROWCOUNT_1 = 'SET ROWCOUNT 1;';
export const LEAVE_IMPLICIT_TRANSACTIONS = 'SET IMPLICIT_TRANSACTIONS ON;';
export const LEAVE_SNAPSHOT_ISOLATION = 'SET TRANSACTION ISOLATION LEVEL SNAPSHOT;';

/** Two rows from no table: one comes back while SET ROWCOUNT 1 is in force. */
export const ROWCOUNT_PROBE = 'SELECT t.[V] FROM (VALUES (1), (2)) AS t([V]);';

/** Cleanup for a test connection that a broken store left inside a transaction. */
export const ROLLBACK_LEFTOVER = 'IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;';

/** A row of LOCKS_OF_SESSION. */
export interface SessionLockRow {
  ResourceType: string;
  Mode: string;
  Status: string;
  Resource: string | null;
  Object: string | null;
  Index: string | null;
}

/** The locks session @spid holds or waits for in this database, named where they are on a row or index. */
export const LOCKS_OF_SESSION = `SELECT l.[resource_type] AS [ResourceType], l.[request_mode] AS [Mode], l.[request_status] AS [Status],
  l.[resource_description] AS [Resource], OBJECT_NAME(p.[object_id]) AS [Object], i.[name] AS [Index]
FROM sys.dm_tran_locks AS l
LEFT JOIN sys.partitions AS p
  ON l.[resource_type] IN ('KEY', 'PAGE', 'RID', 'HOBT') AND p.[hobt_id] = l.[resource_associated_entity_id]
LEFT JOIN sys.indexes AS i ON i.[object_id] = p.[object_id] AND i.[index_id] = p.[index_id]
WHERE l.[request_session_id] = @spid AND l.[resource_database_id] = DB_ID() AND l.[resource_type] <> 'DATABASE'
ORDER BY l.[resource_type], l.[request_mode], l.[resource_description];`;

/**
 * @schema: the PAGE locks any session holds or waits for on the schema's Jobs and Groups tables,
 * one row per lock and requester, named by index (review 2, R2-8: READPAST "skips row-level
 * locks, but page-level locks aren't skipped", and schema version 10 turns page locks off on every
 * index of those tables). A PAGE lock names its index through resource_associated_entity_id, the
 * HoBt id, which sys.dm_tran_locks says "is not always available for PAGE resources": such a lock
 * cannot be placed on a table and is not listed.
 */
export const PAGE_LOCKS_ON_QUEUE_TABLES = `SELECT l.[request_session_id] AS [Session], l.[request_mode] AS [Mode], l.[request_status] AS [Status],
  l.[resource_description] AS [Resource], o.[name] AS [Object], i.[name] AS [Index]
FROM sys.dm_tran_locks AS l
INNER JOIN sys.partitions AS p ON p.[hobt_id] = l.[resource_associated_entity_id]
INNER JOIN sys.objects AS o ON o.[object_id] = p.[object_id]
LEFT JOIN sys.indexes AS i ON i.[object_id] = p.[object_id] AND i.[index_id] = p.[index_id]
WHERE l.[resource_type] = 'PAGE' AND l.[resource_database_id] = DB_ID()
  AND o.[schema_id] = SCHEMA_ID(@schema) AND o.[name] IN (N'Jobs', N'Groups');`;

/** @schema: every index (and heap) of the schema's tables, with whether it allows row and page locks. */
export const INDEX_LOCK_OPTIONS = `SELECT t.[name] AS [Table], COALESCE(i.[name], N'(heap)') AS [Index],
  CAST(i.[allow_row_locks] AS int) AS [AllowRowLocks], CAST(i.[allow_page_locks] AS int) AS [AllowPageLocks]
FROM sys.indexes AS i
INNER JOIN sys.tables AS t ON t.[object_id] = i.[object_id]
WHERE t.[schema_id] = SCHEMA_ID(@schema) AND i.[is_hypothetical] = 0
ORDER BY t.[name], i.[index_id];`;

/**
 * The queue's jobs that no one holds a lock on (READPAST skips locked rows; READCOMMITTEDLOCK
 * makes that legal where READ_COMMITTED_SNAPSHOT is on). Never waits.
 */
export function unlockedJobs(schema: string): string {
  return `SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
SELECT COUNT_BIG(*) AS [Unlocked] FROM ${JOBS(schema)} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue;`;
}

/**
 * The claim's hints plus ROWLOCK, as NServiceBus and Orleans ship them: the table-hints page
 * allows one hint per granularity group, and READCOMMITTEDLOCK and ROWLOCK share one. Whether
 * SQL Server accepts the set anyway is what running this settles (review, "Table hints").
 */
export function claimHintsWithRowlock(schema: string): string {
  return `SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
SELECT TOP (1) [Id] FROM ${JOBS(schema)} WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK, ROWLOCK) WHERE [State] = 'ready';`;
}

/** A read inside a SNAPSHOT transaction: the snapshot starts at its first data access, not at BEGIN. */
export function startSnapshot(schema: string): string {
  return `SELECT COUNT_BIG(*) AS [Jobs] FROM ${JOBS(schema)};`;
}

/** Records a newer schema version, as a future release of the library would. */
export function bumpSchemaVersion(schema: string): string {
  return `INSERT INTO ${quoteMssqlIdentifier(schema)}.[SchemaVersion] ([Version], [Description]) VALUES (@version, N'from the future');`;
}

/** Around a statement: each statement after ON returns its actual plan as one more result set. */
export const STATISTICS_XML_ON = 'SET STATISTICS XML ON;';
export const STATISTICS_XML_OFF = 'SET STATISTICS XML OFF;';

/**
 * Marks every cached plan that reads @table (a quoted two-part name) for recompilation, so the
 * next call compiles for the data as it is now, not as it was when an earlier call ran.
 */
export const RECOMPILE_PLANS_OF_TABLE = 'EXEC sys.sp_recompile @objname = @table;';

/** The filtered indexes on a table (@table: a quoted two-part name), with each one's leading key column. */
export const FILTERED_INDEXES = `SELECT i.[name] AS [Index], i.[filter_definition] AS [Filter], c.[name] AS [LeadingKey]
FROM sys.indexes AS i
INNER JOIN sys.index_columns AS ic
  ON ic.[object_id] = i.[object_id] AND ic.[index_id] = i.[index_id] AND ic.[key_ordinal] = 1
INNER JOIN sys.columns AS c ON c.[object_id] = ic.[object_id] AND c.[column_id] = ic.[column_id]
WHERE i.[object_id] = OBJECT_ID(@table) AND i.[has_filter] = 1
ORDER BY i.[name];`;

/**
 * The deadlock reports in the system_health session's ring buffer, with their timestamps (UTC,
 * ISO 8601) as text: the caller filters by time. Filtered to xml_deadlock_report server-side,
 * so only those events cross the wire.
 */
export const DEADLOCK_REPORTS = `SELECT x.e.value('@timestamp', 'nvarchar(40)') AS [At], CAST(x.e.query('.') AS nvarchar(max)) AS [Report]
FROM (
  SELECT CAST(t.[target_data] AS xml) AS [Data]
  FROM sys.dm_xe_session_targets AS t
  INNER JOIN sys.dm_xe_sessions AS s ON s.[address] = t.[event_session_address]
  WHERE s.[name] = N'system_health' AND t.[target_name] = N'ring_buffer'
) AS rb
CROSS APPLY rb.[Data].nodes('RingBufferTarget/event[@name="xml_deadlock_report"]') AS x(e);`;

/** Two rows two sessions update in opposite orders: a deadlock the test causes on purpose. */
export function createDeadlockCanary(schema: string): string {
  const table = `${quoteMssqlIdentifier(schema)}.[DeadlockCanary]`;
  return `CREATE TABLE ${table} ([Id] int NOT NULL CONSTRAINT [PK_DeadlockCanary] PRIMARY KEY, [Touches] int NOT NULL);
INSERT INTO ${table} ([Id], [Touches]) VALUES (1, 0), (2, 0);`;
}

export function touchDeadlockCanary(schema: string): string {
  return `UPDATE ${quoteMssqlIdentifier(schema)}.[DeadlockCanary] SET [Touches] = [Touches] + 1 WHERE [Id] = @id;`;
}

/** Makes this session the one SQL Server picks as the victim of a deadlock it is part of. */
export const VOLUNTEER_AS_DEADLOCK_VICTIM = 'SET DEADLOCK_PRIORITY LOW;';

// ---- the failure drills' idempotent receiver (see test/workers/nest-worker.ts) ----------

/** The receiver's tables, in the queue's schema; the schema drop removes them with it. */
export function createEffectTables(schema: string): string {
  const s = quoteMssqlIdentifier(schema);
  return `CREATE TABLE ${s}.[Effects] (
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT [PK_Effects] PRIMARY KEY,
  [JobId] bigint NOT NULL,
  [Pid] int NOT NULL,
  [At] datetime2(3) NOT NULL CONSTRAINT [DF_Effects_At] DEFAULT (SYSUTCDATETIME())
);
CREATE TABLE ${s}.[Runs] (
  [Seq] bigint IDENTITY(1, 1) NOT NULL CONSTRAINT [PK_Runs] PRIMARY KEY,
  [JobId] bigint NOT NULL,
  [Pid] int NOT NULL,
  [Attempt] int NOT NULL,
  [At] datetime2(3) NOT NULL CONSTRAINT [DF_Runs_At] DEFAULT (SYSUTCDATETIME())
);
CREATE TABLE ${s}.[EffectWrites] (
  [Seq] bigint IDENTITY(1, 1) NOT NULL CONSTRAINT [PK_EffectWrites] PRIMARY KEY,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [JobId] bigint NOT NULL,
  [Pid] int NOT NULL,
  [Attempt] int NOT NULL,
  [Applied] bit NOT NULL,
  [At] datetime2(3) NOT NULL CONSTRAINT [DF_EffectWrites_At] DEFAULT (SYSUTCDATETIME())
);`;
}

/** @jobId, @pid, @attempt: one handler start. */
export function recordRun(schema: string): string {
  return `INSERT INTO ${quoteMssqlIdentifier(schema)}.[Runs] ([JobId], [Pid], [Attempt]) VALUES (@jobId, @pid, @attempt);`;
}

/**
 * @key, @jobId, @pid, @attempt: the business effect, at most once per key, and the log of this
 * attempt to write it, committed together. UPDLOCK + HOLDLOCK serialize two writers of one key.
 */
export function writeEffect(schema: string): string {
  const s = quoteMssqlIdentifier(schema);
  return `SET XACT_ABORT ON;
DECLARE @applied bit = 0;
BEGIN TRANSACTION;
INSERT INTO ${s}.[Effects] ([IdempotencyKey], [JobId], [Pid])
SELECT @key, @jobId, @pid
WHERE NOT EXISTS (SELECT 1 FROM ${s}.[Effects] WITH (UPDLOCK, HOLDLOCK) WHERE [IdempotencyKey] = @key);
IF @@ROWCOUNT = 1 SET @applied = 1;
INSERT INTO ${s}.[EffectWrites] ([IdempotencyKey], [JobId], [Pid], [Attempt], [Applied])
VALUES (@key, @jobId, @pid, @attempt, @applied);
COMMIT TRANSACTION;
SELECT @applied AS [Applied];`;
}

/** @id: the raw job row, named as the PostgreSQL drills read it, token and all. */
export function drillJobRow(schema: string): string {
  return `SELECT [State] AS [state], [Attempts] AS [attempts], LOWER(CAST([ClaimToken] AS char(36))) AS [claim_token],
  [LeaseUntil] AS [lease_until], [WorkerId] AS [worker_id], [ClaimedAt] AS [claimed_at], [FinishedAt] AS [finished_at],
  [LastError] AS [last_error]
FROM ${JOBS(schema)} WHERE [Id] = @id;`;
}

/** @jobId: every start of the job's handler, in order. */
export function runsOfJob(schema: string): string {
  return `SELECT [Pid] AS [pid], [Attempt] AS [attempt] FROM ${quoteMssqlIdentifier(schema)}.[Runs] WHERE [JobId] = @jobId ORDER BY [Seq];`;
}

/** @key: every attempt to write the key's effect, in order, and whether it was applied. */
export function effectWritesOfKey(schema: string): string {
  return `SELECT [Pid] AS [pid], [Applied] AS [applied] FROM ${quoteMssqlIdentifier(schema)}.[EffectWrites] WHERE [IdempotencyKey] = @key ORDER BY [Seq];`;
}

/** @key: the process that applied the key's effect. */
export function effectOfKey(schema: string): string {
  return `SELECT [Pid] AS [pid] FROM ${quoteMssqlIdentifier(schema)}.[Effects] WHERE [IdempotencyKey] = @key;`;
}

/** Six result sets: totals, jobs not done, keys without effect, keys with two, stray effects, re-run jobs. */
export function effectsReport(schema: string): string {
  const s = quoteMssqlIdentifier(schema);
  const key = (alias: string) => `COALESCE(${alias}.[IdempotencyKey], CONCAT(N'job-', ${alias}.[Id]))`;
  return `SELECT (SELECT COUNT(*) FROM ${s}.[Jobs]) AS [jobs],
  (SELECT COUNT(*) FROM ${s}.[Jobs] WHERE [State] = 'done') AS [done],
  (SELECT COUNT(*) FROM ${s}.[Effects]) AS [effects],
  (SELECT COUNT(*) FROM ${s}.[Runs]) AS [runs],
  (SELECT COUNT(*) FROM ${s}.[EffectWrites] WHERE [Applied] = 0) AS [refused];
SELECT TOP (50) CAST([Id] AS varchar(20)) AS [id], [State] AS [state], [IdempotencyKey] AS [key]
FROM ${s}.[Jobs] WHERE [State] <> 'done' ORDER BY [Id];
SELECT TOP (50) ${key('j')} AS [key] FROM ${s}.[Jobs] AS j
WHERE NOT EXISTS (SELECT 1 FROM ${s}.[Effects] AS e WHERE e.[IdempotencyKey] = ${key('j')})
ORDER BY j.[Id];
SELECT TOP (50) [IdempotencyKey] AS [key] FROM ${s}.[Effects] GROUP BY [IdempotencyKey] HAVING COUNT(*) > 1;
SELECT COUNT(*) AS [n] FROM ${s}.[Effects] AS e
WHERE NOT EXISTS (SELECT 1 FROM ${s}.[Jobs] AS j WHERE ${key('j')} = e.[IdempotencyKey]);
SELECT COUNT(*) AS [n] FROM (SELECT [JobId] FROM ${s}.[Runs] GROUP BY [JobId] HAVING COUNT(*) > 1) AS r;`;
}

/** The database clock, UTC (what extended-event timestamps are in). */
export const DATABASE_CLOCK = 'SELECT SYSUTCDATETIME() AS [Now];';

/** @since datetime2(3), @ms int: whether the database clock is past since + ms. */
export const CLOCK_PAST = `SELECT CAST(CASE WHEN SYSUTCDATETIME() > DATEADD(millisecond, @ms, @since) THEN 1 ELSE 0 END AS bit) AS [Past];`;

// ---- ordered groups (issue 11) --------------------------------------------------------------

const GROUPS = (schema: string) => `${quoteMssqlIdentifier(schema)}.[Groups]`;

/**
 * @queue: every ordered group of the queue whose cached state disagrees with its jobs (design
 * (a)'s predicate as the oracle), one row each with what is wrong; none when they agree. Read it
 * when the queue is at rest (no transition under way). The rules:
 * - a group with unfinished jobs has a row, and a row without unfinished jobs is deleted
 *   (unless it is blocked: its head is then a dead job);
 * - the group's leased jobs share one token, and the row is held by that token exactly while
 *   one is leased;
 * - a row neither held nor blocked is headed by the group's lowest unfinished job;
 * - a held row's head is at or before the lowest unfinished job (a batch's finished jobs do not
 *   move it);
 * - a blocked row is not held and is headed by a dead job of the group;
 * - a row whose head is not due yet waits (Waiting), outside the claimable index, and only an
 *   idle row waits.
 */
export function groupDisagreements(schema: string): string {
  const jobs = JOBS(schema);
  const groups = GROUPS(schema);
  return `WITH unfinished AS (
  SELECT [Queue], [GroupKey], MIN([Id]) AS [FirstId],
         COUNT(CASE WHEN [State] = 'leased' THEN 1 END) AS [Leased],
         COUNT(DISTINCT CASE WHEN [State] = 'leased' THEN [ClaimToken] END) AS [LeaseTokens],
         MIN(CASE WHEN [State] = 'leased' THEN CAST([ClaimToken] AS char(36)) END) AS [LeaseToken]
  FROM ${jobs}
  WHERE [Queue] = @queue AND [GroupKey] IS NOT NULL AND [State] IN ('ready', 'delayed', 'leased')
  GROUP BY [Queue], [GroupKey]
), rows AS (
  SELECT [Queue], [GroupKey], [HeadId], [HeldToken], [Blocked], [Waiting], [HeadReadyAt] FROM ${groups} WHERE [Queue] = @queue
), checked AS (
  SELECT COALESCE(u.[GroupKey], g.[GroupKey]) AS [GroupKey], CAST(g.[HeadId] AS varchar(20)) AS [HeadId],
         CAST(u.[FirstId] AS varchar(20)) AS [FirstId],
    CASE
      WHEN g.[GroupKey] IS NULL THEN 'unfinished jobs but no group row'
      WHEN u.[LeaseTokens] > 1 THEN 'jobs leased under more than one token'
      WHEN g.[Blocked] = 1 AND g.[HeldToken] IS NOT NULL THEN 'blocked and held'
      WHEN g.[Waiting] = 1 AND (g.[Blocked] = 1 OR g.[HeldToken] IS NOT NULL) THEN 'waiting, but held or blocked'
      WHEN g.[Waiting] = 0 AND g.[HeldToken] IS NULL AND g.[Blocked] = 0 AND g.[HeadReadyAt] > SYSUTCDATETIME()
        THEN 'a head not due yet in the claimable index (not waiting)'
      WHEN g.[Blocked] = 1 AND NOT EXISTS (
        SELECT 1 FROM ${jobs} AS d
        WHERE d.[Id] = g.[HeadId] AND d.[Queue] = g.[Queue] AND d.[GroupKey] = g.[GroupKey] AND d.[State] = 'dead')
        THEN 'blocked by a job that is not a dead job of the group'
      WHEN g.[Blocked] = 1 THEN NULL
      WHEN u.[GroupKey] IS NULL THEN 'a row without unfinished jobs'
      WHEN u.[Leased] > 0 AND (g.[HeldToken] IS NULL OR LOWER(CAST(g.[HeldToken] AS char(36))) <> LOWER(u.[LeaseToken]))
        THEN 'leased jobs, but not held by their token'
      WHEN u.[Leased] = 0 AND g.[HeldToken] IS NOT NULL THEN 'held, but no job is leased'
      WHEN g.[HeldToken] IS NULL AND (g.[HeadId] IS NULL OR g.[HeadId] <> u.[FirstId])
        THEN 'not held, and not headed by its first unfinished job'
      WHEN g.[HeldToken] IS NOT NULL AND g.[HeadId] > u.[FirstId] THEN 'held, with a head after its first unfinished job'
    END AS [Problem]
  FROM unfinished AS u
  FULL OUTER JOIN rows AS g ON g.[Queue] = u.[Queue] AND g.[GroupKey] = u.[GroupKey]
)
SELECT [GroupKey], [Problem], [HeadId], [FirstId] FROM checked WHERE [Problem] IS NOT NULL ORDER BY [GroupKey];`;
}

/** @queue, @groupKey: the group's row as the store caches it (no row: none). */
export function groupRow(schema: string): string {
  return `SELECT CAST([HeadId] AS varchar(20)) AS [HeadId], LOWER(CAST([HeldToken] AS char(36))) AS [HeldToken],
  CAST([Blocked] AS int) AS [Blocked], CAST([Waiting] AS int) AS [Waiting], [HeadReadyAt]
FROM ${GROUPS(schema)} WHERE [Queue] = @queue AND [GroupKey] = @groupKey;`;
}

/**
 * @queue, @groupKey: what a claimer does to a group and its head before it commits (hold the row
 * with a fresh token, lease the head with it), for a test to run in a transaction it keeps open:
 * the row and the head stay locked as a claimer's do mid-claim. Returns the head's id.
 */
export function leaseGroupHeadUncommitted(schema: string): string {
  const jobs = JOBS(schema);
  const groups = GROUPS(schema);
  return `DECLARE @token uniqueidentifier = NEWID(), @head bigint;
UPDATE ${groups} WITH (ROWLOCK)
SET [HeldToken] = @token, @head = [HeadId]
WHERE [Queue] = @queue AND [GroupKey] = @groupKey AND [HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0
  AND [Waiting] = 0;
UPDATE ${jobs} WITH (ROWLOCK)
SET [State] = 'leased', [ClaimToken] = @token, [Attempts] = [Attempts] + 1,
    [LeaseUntil] = DATEADD(minute, 5, SYSUTCDATETIME()), [ClaimedAt] = SYSUTCDATETIME()
WHERE [Id] = @head AND [State] IN ('ready', 'delayed');
SELECT CAST(@head AS varchar(20)) AS [HeadId];`;
}

/**
 * The claim's group hints without READCOMMITTEDLOCK. The table-hints page says READPAST can't be
 * specified under READ_COMMITTED_SNAPSHOT at READ COMMITTED unless READCOMMITTEDLOCK is there,
 * and also that UPDLOCK makes READCOMMITTEDLOCK ignored; what SQL Server does with the pair
 * alone on each database is recorded by the test that runs this (research A (ii) 12).
 */
export function groupClaimHintsWithoutReadCommittedLock(schema: string): string {
  return `SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
SELECT TOP (1) [GroupKey] FROM ${GROUPS(schema)} WITH (UPDLOCK, READPAST) WHERE [Queue] = @queue;`;
}

/**
 * A job row as a version before 5 wrote it (no group state): @queue, @groupKey, @state,
 * @runInMs (its run time from now, may be negative), @token (leased jobs; null otherwise).
 * Returns its id, taken from the schema's sequence in id order.
 */
export function insertPreGroupsJob(schema: string): string {
  const s = quoteMssqlIdentifier(schema);
  return `DECLARE @range sql_variant;
EXEC sys.sp_sequence_get_range @sequence_name = N'${s}.[JobIdSequence]', @range_size = 1, @range_first_value = @range OUTPUT;
DECLARE @id bigint = CAST(@range AS bigint);
INSERT INTO ${s}.[Jobs] ([Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey], [Attempts], [MaxAttempts],
  [ClaimToken], [LeaseUntil], [ClaimedAt], [WorkerId])
VALUES (@id, @queue, @state, N'{}', 0, DATEADD(millisecond, @runInMs, SYSUTCDATETIME()), @groupKey,
  CASE WHEN @state = 'leased' THEN 1 ELSE 0 END, 5, @token,
  CASE WHEN @state = 'leased' THEN DATEADD(minute, 5, SYSUTCDATETIME()) END,
  CASE WHEN @state = 'leased' THEN SYSUTCDATETIME() END, CASE WHEN @state = 'leased' THEN N'old-version' END);
SELECT CAST(@id AS varchar(20)) AS [Id];`;
}

/** Every statement above, named, for the grammar gate. */
export function everyTestStatement(schema: string): [string, string][] {
  return [
    ['database settings', DATABASE_SETTINGS],
    ['view server state', VIEW_SERVER_STATE],
    ['session state', SESSION_STATE],
    ['session of spid', SESSION_OF_SPID],
    ['leave rowcount 1', LEAVE_ROWCOUNT_1],
    ['leave implicit transactions', LEAVE_IMPLICIT_TRANSACTIONS],
    ['leave snapshot isolation', LEAVE_SNAPSHOT_ISOLATION],
    ['rowcount probe', ROWCOUNT_PROBE],
    ['rollback leftover', ROLLBACK_LEFTOVER],
    ['locks of session', LOCKS_OF_SESSION],
    ['page locks on queue tables', PAGE_LOCKS_ON_QUEUE_TABLES],
    ['index lock options', INDEX_LOCK_OPTIONS],
    ['unlocked jobs', unlockedJobs(schema)],
    ['claim hints with rowlock', claimHintsWithRowlock(schema)],
    ['start snapshot', startSnapshot(schema)],
    ['bump schema version', bumpSchemaVersion(schema)],
    ['statistics xml on', STATISTICS_XML_ON],
    ['statistics xml off', STATISTICS_XML_OFF],
    ['recompile plans of table', RECOMPILE_PLANS_OF_TABLE],
    ['filtered indexes', FILTERED_INDEXES],
    ['deadlock reports', DEADLOCK_REPORTS],
    ['create deadlock canary', createDeadlockCanary(schema)],
    ['touch deadlock canary', touchDeadlockCanary(schema)],
    ['volunteer as deadlock victim', VOLUNTEER_AS_DEADLOCK_VICTIM],
    ['create effect tables', createEffectTables(schema)],
    ['record run', recordRun(schema)],
    ['write effect', writeEffect(schema)],
    ['drill job row', drillJobRow(schema)],
    ['runs of job', runsOfJob(schema)],
    ['effect writes of key', effectWritesOfKey(schema)],
    ['effect of key', effectOfKey(schema)],
    ['effects report', effectsReport(schema)],
    ['database clock', DATABASE_CLOCK],
    ['clock past', CLOCK_PAST],
    ['group disagreements', groupDisagreements(schema)],
    ['group row', groupRow(schema)],
    ['lease group head uncommitted', leaseGroupHeadUncommitted(schema)],
    ['group claim hints without READCOMMITTEDLOCK', groupClaimHintsWithoutReadCommittedLock(schema)],
    ['insert pre-groups job', insertPreGroupsJob(schema)],
  ];
}
