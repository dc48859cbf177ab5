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
  recordQueueSetting: string;
  claim: string;
  heartbeat: string;
  complete: string;
  fail: string;
  release: string;
  reap: string;
  hasClaimableWork: string;
  stats: string;
  getJob: string;
  getAttempts: string;
  listDead: string;
  retryDead: string;
  retryAllDead: string;
  purgeDead: string;
  cleanup: string;
  ping: string;

  // ---- health and measurements ----
  queueHealth: string;
}

/** Table types; the store names them when it binds table-valued parameters. */
export const MSSQL_TABLE_TYPES = {
  jobInput: 'JobInputListV2',
  owned: 'OwnedJobList',
  heartbeat: 'HeartbeatList',
  failure: 'FailureList',
  ids: 'IdList',
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
 */
export const MSSQL_STORE_SESSION = `IF @@TRANCOUNT <> 0
${OPEN_TRANSACTION_THROW}${SESSION_SETTINGS}SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
`;

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
function takeKeyLock(indent: string): string {
  return `${indent}EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction';
${indent}IF @lock < 0
${indent}BEGIN
${indent}  SET @refused = CONCAT(N'nestjs-sql-queue: idempotency key lock not granted (sp_getapplock returned ', @lock, N')');
${indent}  THROW ${MSSQL_KEY_LOCK_REFUSED}, @refused, 1;
${indent}END;`;
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

export function mssqlQueries(schema: string): MssqlQueries {
  const s = quoteMssqlIdentifier(schema);
  const jobs = `${s}.[Jobs]`;
  const attempts = `${s}.[Attempts]`;
  const sequence = `${s}.[JobIdSequence]`;
  const settings = `${s}.[QueueSettings]`;

  // A job whose RunAt is later than the statement's time waits as 'delayed', outside the ready
  // index the claim reads; the claim promotes it once due (see claim).
  const oneRunAt = `COALESCE(@runAt, ${shiftedNow('@delayMs', 1)})`;
  const manyRunAt = `COALESCE(i.[RunAt], ${shiftedNow('i.[DelayMs]', 1)})`;
  const stateFor = (runAt: string) => `CASE WHEN ${runAt} > SYSUTCDATETIME() THEN 'delayed' ELSE 'ready' END`;

  return {
    // @queue, @payload, @priority, @runAt (null: now + @delayMs), @delayMs bigint, @groupKey,
    // @idempotencyKey, @maxAttempts (null: the queue's recorded setting), @defaultMaxAttempts,
    // @inTransaction (1: the caller's open transaction; see ENQUEUE_SESSION and keyedWork).
    // The setting is read into a variable first: COALESCE((subquery), …) runs the subquery twice.
    // With a key: the key's lock, then the existence check; the job's id is the existing one or
    // the reserved one, and nothing is read again after the insert.
    enqueueOne: `${ENQUEUE_SESSION}DECLARE @id bigint, @created bit = 1, @lock int, @refused nvarchar(2048);
${reserveIds('1', sequence)}
DECLARE @jobMaxAttempts int = @maxAttempts, @resource nvarchar(255);
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
    INSERT INTO ${jobs} WITH (ROWLOCK) ([Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey], [IdempotencyKey], [MaxAttempts])
    VALUES (@firstId, @queue, ${stateFor(oneRunAt)}, @payload, @priority, ${oneRunAt}, @groupKey, @idempotencyKey, @jobMaxAttempts);
  END;`)}
SELECT CAST(@id AS varchar(20)) AS [Id], @created AS [Created];`,

    // ROWLOCK on both enqueue statements: READPAST skips locked rows but not locked pages, so
    // a large insert in a caller's long transaction must not take page locks that claims and
    // monitoring reads would then wait on (lock escalation is already off for the table).
    // @jobs JobInputListV2 with Ord = 0..n-1, @inTransaction. A range of ids is reserved first, so
    // every input row knows its id (first + Ord) whether or not it is inserted, and results come
    // back in input order. The first row of a key within the batch is the one inserted; later
    // ones get its id. First rows are found in one pass (ROW_NUMBER over the key: the table type
    // has no index on the key and SQL Server keeps no statistics on a TVP, so a correlated
    // "no earlier row" check could run once per row against every row). @keys is keyed by
    // (Queue, IdempotencyKey) so the joins below seek it. Key locks are taken one per distinct
    // resource, in resource order (@locks), the same order in every producer.
    // A row without its own MaxAttempts takes its queue's recorded setting, else its default.
    enqueueMany: `${ENQUEUE_SESSION}DECLARE @inserted TABLE ([Id] bigint NOT NULL PRIMARY KEY);
DECLARE @keys TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Ord] int NOT NULL, [ExistingId] bigint NULL,
  PRIMARY KEY ([Queue], [IdempotencyKey]));
DECLARE @locks TABLE ([Seq] int NOT NULL PRIMARY KEY, [Resource] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL);
DECLARE @count bigint = (SELECT COUNT_BIG(*) FROM @jobs);
${reserveIds('@count', sequence)}
DECLARE @resource nvarchar(255), @lock int, @refused nvarchar(2048), @seq int = 1, @lockCount int;
INSERT INTO @keys ([Queue], [IdempotencyKey], [Ord])
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
  INSERT INTO ${jobs} WITH (ROWLOCK) ([Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey], [IdempotencyKey], [MaxAttempts])
  OUTPUT inserted.[Id] INTO @inserted ([Id])
  SELECT @firstId + i.[Ord], i.[Queue], ${stateFor(manyRunAt)}, i.[Payload], i.[Priority],
         ${manyRunAt},
         i.[GroupKey], i.[IdempotencyKey], COALESCE(i.[MaxAttempts], q.[MaxAttempts], i.[DefaultMaxAttempts])
  FROM @jobs AS i
  LEFT JOIN @keys AS k ON k.[Queue] = i.[Queue] AND k.[IdempotencyKey] = i.[IdempotencyKey]
  LEFT JOIN ${settings} AS q ON q.[Queue] = i.[Queue]
  WHERE i.[IdempotencyKey] IS NULL OR (k.[Ord] = i.[Ord] AND k.[ExistingId] IS NULL);`)}
SELECT i.[Ord],
       CAST(CASE WHEN n.[Id] IS NOT NULL THEN n.[Id] WHEN k.[ExistingId] IS NOT NULL THEN k.[ExistingId]
                 ELSE @firstId + k.[Ord] END AS varchar(20)) AS [Id],
       CAST(CASE WHEN n.[Id] IS NULL THEN 0 ELSE 1 END AS bit) AS [Created]
FROM @jobs AS i
LEFT JOIN @inserted AS n ON n.[Id] = @firstId + i.[Ord]
LEFT JOIN @keys AS k ON k.[Queue] = i.[Queue] AND k.[IdempotencyKey] = i.[IdempotencyKey]
ORDER BY i.[Ord];`,

    // @queue, @maxAttempts: insert or update one queue's setting. The UPDATE's UPDLOCK + HOLDLOCK
    // hold the key (or, when it is missing, its range) until commit, so two processes recording
    // the same new queue at once serialize: the second updates the row the first inserted
    // instead of failing on the primary key.
    recordQueueSetting: `${MSSQL_STORE_SESSION}${atomically(`  UPDATE ${settings} WITH (UPDLOCK, HOLDLOCK)
  SET [MaxAttempts] = @maxAttempts, [UpdatedAt] = SYSUTCDATETIME()
  WHERE [Queue] = @queue;
  IF @@ROWCOUNT = 0
    INSERT INTO ${settings} ([Queue], [MaxAttempts]) VALUES (@queue, @maxAttempts);`)}`,

    // @limit, @leaseMs, @queue, @workerId. The seed's pattern: autocommit only (the session
    // guard), the claim hints (CLAIM_HINTS: UPDLOCK takes and keeps the read's locks, READPAST
    // skips rows other claimers hold, READCOMMITTEDLOCK keeps READPAST legal where
    // READ_COMMITTED_SNAPSHOT is on); the CTE is updated in place and the OUTPUT goes INTO a
    // table variable (allowed with triggers present); NEWID() per row.
    // First, its own autocommit statement with the same hints: up to @limit of the queue's due
    // delayed jobs, oldest first (a range seek on IX_Jobs_Delayed), become ready, so the claim
    // that follows sees them. The ready index holds no delayed rows, so neither statement reads
    // (or U-locks) the delayed backlog, whatever its priorities (review P2). A promoted job
    // another claimer takes first is simply claimed there.
    claim: `${MSSQL_STORE_SESSION}DECLARE @claimed TABLE (
  [Id] bigint NOT NULL, [Queue] nvarchar(128) NOT NULL, [Payload] nvarchar(max) NOT NULL, [Priority] int NOT NULL,
  [GroupKey] nvarchar(255) NULL, [IdempotencyKey] nvarchar(255) NULL, [Attempts] int NOT NULL, [MaxAttempts] int NOT NULL,
  [ClaimToken] uniqueidentifier NOT NULL, [CreatedAt] datetime2(3) NOT NULL, [ClaimedAt] datetime2(3) NOT NULL,
  [LeaseUntil] datetime2(3) NOT NULL);
WITH due AS (
  SELECT TOP (@limit) *
  FROM ${jobs} WITH (${CLAIM_HINTS})
  WHERE [Queue] = @queue AND [State] = 'delayed' AND [RunAt] <= SYSUTCDATETIME()
  ORDER BY [RunAt], [Id]
)
UPDATE due
SET [State] = 'ready';
WITH candidate AS (
  SELECT TOP (@limit) *
  FROM ${jobs} WITH (${CLAIM_HINTS})
  WHERE [Queue] = @queue AND [State] = 'ready' AND [RunAt] <= SYSUTCDATETIME()
  ORDER BY [Priority] DESC, [RunAt], [Id]
)
UPDATE candidate
SET [State] = 'leased', [ClaimToken] = NEWID(), [Attempts] = [Attempts] + 1,
    [LeaseUntil] = DATEADD(millisecond, @leaseMs, SYSUTCDATETIME()), [ClaimedAt] = SYSUTCDATETIME(), [WorkerId] = @workerId
OUTPUT inserted.[Id], inserted.[Queue], inserted.[Payload], inserted.[Priority], inserted.[GroupKey], inserted.[IdempotencyKey],
       inserted.[Attempts], inserted.[MaxAttempts], inserted.[ClaimToken], inserted.[CreatedAt], inserted.[ClaimedAt],
       inserted.[LeaseUntil]
INTO @claimed;
SELECT CAST([Id] AS varchar(20)) AS [Id], [Queue], [Payload], [Priority], [GroupKey], [IdempotencyKey], [Attempts], [MaxAttempts],
       CAST([ClaimToken] AS char(36)) AS [ClaimToken], [CreatedAt], [ClaimedAt], [LeaseUntil]
FROM @claimed;`,

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
    // reply was lost is recognised ('already') instead of reported as lost.
    complete: `${MSSQL_STORE_SESSION}DECLARE @completed TABLE ([Id] bigint NOT NULL PRIMARY KEY);
UPDATE j
SET [State] = 'done', [FinishedAt] = SYSUTCDATETIME(), [LeaseUntil] = NULL
OUTPUT inserted.[Id] INTO @completed ([Id])
FROM ${jobs} AS j WITH (ROWLOCK)
INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
WHERE j.[State] = 'leased';
SELECT CAST(i.[Id] AS varchar(20)) AS [Id],
  CASE WHEN c.[Id] IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${jobs} AS d WHERE d.[Id] = i.[Id] AND d.[ClaimToken] = i.[Token] AND d.[State] = 'done') THEN 'already'
       ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @completed AS c ON c.[Id] = i.[Id];`,

    // @items FailureList. The state change and its attempt row commit together. A retry with a
    // delay waits as 'delayed' (out of the claim's ready index); the claim promotes it once due.
    fail: `${MSSQL_STORE_SESSION}DECLARE @failed TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) NOT NULL, [State] varchar(8) NOT NULL, [Attempt] int NOT NULL,
  [ClaimedAt] datetime2(3) NULL, [Token] uniqueidentifier NOT NULL);
${atomically(`  UPDATE j
  SET [State] = CASE WHEN i.[Dead] = 1 OR j.[Attempts] >= j.[MaxAttempts] THEN 'dead'
                     WHEN i.[DelayMs] > 0 THEN 'delayed' ELSE 'ready' END,
      [RunAt] = CASE WHEN i.[Dead] = 1 OR j.[Attempts] >= j.[MaxAttempts] THEN j.[RunAt]
                     ELSE DATEADD(millisecond, i.[DelayMs], SYSUTCDATETIME()) END,
      [FinishedAt] = CASE WHEN i.[Dead] = 1 OR j.[Attempts] >= j.[MaxAttempts] THEN SYSUTCDATETIME() ELSE NULL END,
      [ClaimToken] = NULL, [LeaseUntil] = NULL, [LastError] = i.[Error]
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[State], inserted.[Attempts], inserted.[ClaimedAt], deleted.[ClaimToken]
  INTO @failed ([Id], [Queue], [State], [Attempt], [ClaimedAt], [Token])
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
  WHERE j.[State] = 'leased';
  INSERT INTO ${attempts} WITH (ROWLOCK) ([JobId], [Queue], [Attempt], [Outcome], [Error], [Stack], [WorkerId], [ClaimToken], [StartedAt], [FinishedAt])
  SELECT f.[Id], f.[Queue], f.[Attempt], 'failed', i.[Error], i.[Stack], i.[WorkerId], f.[Token], f.[ClaimedAt], SYSUTCDATETIME()
  FROM @failed AS f INNER JOIN @items AS i ON i.[Id] = f.[Id];`)}
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], f.[State],
  CASE WHEN f.[Id] IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${attempts} AS a WHERE a.[JobId] = i.[Id] AND a.[ClaimToken] = i.[Token] AND a.[Outcome] = 'failed') THEN 'already'
       ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @failed AS f ON f.[Id] = i.[Id];`,

    // @items OwnedJobList: leased but never started; the claim's attempt is given back.
    release: `${MSSQL_STORE_SESSION}DECLARE @released TABLE ([Id] bigint NOT NULL PRIMARY KEY);
UPDATE j
SET [State] = 'ready', [Attempts] = CASE WHEN j.[Attempts] > 0 THEN j.[Attempts] - 1 ELSE 0 END, [ClaimToken] = NULL,
    [LeaseUntil] = NULL, [ClaimedAt] = NULL, [WorkerId] = NULL
OUTPUT inserted.[Id] INTO @released ([Id])
FROM ${jobs} AS j WITH (ROWLOCK)
INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
WHERE j.[State] = 'leased';
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], CASE WHEN r.[Id] IS NOT NULL THEN 'ok' ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @released AS r ON r.[Id] = i.[Id];`,

    // @batch. One conditional statement: lock expired leases (skipping rows another reaper
    // holds; the locking read re-checks the predicate), void the token, record the attempt.
    // RunAt is kept: the job keeps its place, and its waiting age keeps counting.
    reap: `${MSSQL_STORE_SESSION}DECLARE @reaped TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) NOT NULL, [State] varchar(8) NOT NULL, [Attempt] int NOT NULL,
  [Token] uniqueidentifier NULL, [WorkerId] nvarchar(255) NULL, [ClaimedAt] datetime2(3) NULL, [LastError] nvarchar(max) NULL);
${atomically(`  WITH expired AS (
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
         deleted.[ClaimedAt], inserted.[LastError]
  INTO @reaped ([Id], [Queue], [State], [Attempt], [Token], [WorkerId], [ClaimedAt], [LastError]);
  INSERT INTO ${attempts} WITH (ROWLOCK) ([JobId], [Queue], [Attempt], [Outcome], [Error], [Stack], [WorkerId], [ClaimToken], [StartedAt], [FinishedAt])
  SELECT [Id], [Queue], [Attempt], 'lease-expired', [LastError], NULL, [WorkerId], [Token], [ClaimedAt], SYSUTCDATETIME()
  FROM @reaped;`)}
SELECT CAST([Id] AS varchar(20)) AS [Id], [Queue], [State], [Attempt] FROM @reaped;`,

    // A due delayed job counts: the next claim promotes and takes it.
    hasClaimableWork: `${MSSQL_STORE_SESSION}SELECT CAST(CASE WHEN EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'ready' AND [RunAt] <= SYSUTCDATETIME()
) OR EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'delayed' AND [RunAt] <= SYSUTCDATETIME()
) THEN 1 ELSE 0 END AS bit) AS [HasWork];`,

    // Each figure reads one filtered index that covers it (Attempts is included in the ready
    // index since migration 3, and in the delayed index), so the cost follows live rows, not history.
    // A delayed job that is due but not promoted yet (no claim since) counts as ready: it is
    // waiting. Ready rows not due yet only exist if written before version 4 (which moved them).
    // READPAST: a monitoring read must never queue behind a producer's open transaction (as
    // PostgreSQL's MVCC reads never do); rows locked at that instant are simply not counted.
    stats: `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'ready' AND [RunAt] <= @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [RunAt] <= @now) AS [Ready],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [RunAt] > @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'ready' AND [RunAt] > @now) AS [Delayed],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'leased') AS [Leased],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'leased' AND [LeaseUntil] < @now) AS [ExpiredLeases],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'dead') AS [Dead],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'ready' AND [Attempts] > 0)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [Attempts] > 0) AS [Retrying],
  (SELECT DATEDIFF_BIG(millisecond, MIN(w.[RunAt]), @now) FROM (
     SELECT MIN([RunAt]) AS [RunAt] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
     WHERE [Queue] = @queue AND [State] = 'ready' AND [RunAt] <= @now
     UNION ALL
     SELECT MIN([RunAt]) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
     WHERE [Queue] = @queue AND [State] = 'delayed' AND [RunAt] <= @now) AS w) AS [OldestReadyAgeMs];`,

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

    // @queue, @ids IdList
    retryDead: `${MSSQL_STORE_SESSION}DECLARE @retried TABLE ([Id] bigint NOT NULL PRIMARY KEY);
UPDATE j
SET [State] = 'ready', [Attempts] = 0, [RunAt] = SYSUTCDATETIME(), [FinishedAt] = NULL, [ClaimToken] = NULL
OUTPUT inserted.[Id] INTO @retried ([Id])
FROM ${jobs} AS j WITH (ROWLOCK) INNER JOIN @ids AS i ON i.[Id] = j.[Id]
WHERE j.[Queue] = @queue AND j.[State] = 'dead';
SELECT CAST([Id] AS varchar(20)) AS [Id] FROM @retried;`,

    // @queue, @afterId bigint (0 first), @batch. One keyset batch in Id order: lock escalation is
    // off (migration 1), so an unbounded UPDATE would hold key locks on every dead row (PK,
    // IX_Jobs_Dead, IX_Jobs_Claim) until it ends; the store loops, each batch its own
    // autocommit statement. The ordered TOP is the UPDATE page's recipe ("use TOP together with
    // ORDER BY in a subselect", https://learn.microsoft.com/sql/t-sql/queries/update-transact-sql),
    // a range seek on IX_Jobs_Dead ([Queue], [Id]) that stops after @batch rows; Id order is the
    // order the other batched writers lock PK rows in. A job retried and dead again during the
    // loop keeps its Id, below @afterId, so it is not retried twice.
    retryAllDead: `${MSSQL_STORE_SESSION}DECLARE @retried TABLE ([Id] bigint NOT NULL PRIMARY KEY);
WITH batch AS (
  SELECT TOP (@batch) *
  FROM ${jobs} WITH (ROWLOCK)
  WHERE [Queue] = @queue AND [State] = 'dead' AND [Id] > @afterId
  ORDER BY [Id]
)
UPDATE batch
SET [State] = 'ready', [Attempts] = 0, [RunAt] = SYSUTCDATETIME(), [FinishedAt] = NULL, [ClaimToken] = NULL
OUTPUT inserted.[Id] INTO @retried ([Id]);
SELECT CAST([Id] AS varchar(20)) AS [Id] FROM @retried ORDER BY [Id];`,

    // @queue, @olderThanMs bigint (0 for all), @batch
    purgeDead: `${MSSQL_STORE_SESSION}DELETE TOP (@batch) FROM ${jobs} WITH (ROWLOCK)
WHERE [Queue] = @queue AND [State] = 'dead' AND [FinishedAt] <= ${shiftedNow('@olderThanMs', -1)};
SELECT @@ROWCOUNT AS [Deleted];`,

    // @doneMs, @keyMs, @deadMs (null: keep dead jobs), @batch; all bigint milliseconds. At most
    // @batch rows in all: each DELETE takes what the ones before it left of the budget, so a
    // short answer means nothing old is left. Each DELETE is its own autocommit statement with
    // a predicate a FinishedAt-led filtered index can answer as one range: keyless done rows,
    // keyed done rows (kept until the key window passes too), dead rows.
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
  DELETE TOP (@batch - @deleted) FROM ${jobs} WITH (ROWLOCK)
  WHERE [State] = 'dead' AND [FinishedAt] < @deadBefore
    AND ([IdempotencyKey] IS NULL OR [FinishedAt] < @keyBefore);
  SET @deleted = @deleted + @@ROWCOUNT;
END;
SELECT @deleted AS [Deleted];`,

    ping: 'SELECT 1 AS [Ok];',

    // ---- health and measurements --------------------------------------------------------

    // @windowMs bigint, @repeated int. Every queue in one batch, for scrapes. Each live figure
    // reads one filtered index that covers it (ready, leased, dead), so done rows are never
    // read. Attempts have no index on FinishedAt alone: their queues are walked on
    // IX_Attempts_Recent ([Queue], [FinishedAt]) INCLUDE ([Outcome]) one MIN seek at a time, and
    // each queue's recent attempts are one range seek on it. READPAST, as in stats: a monitoring
    // read never queues behind a producer's open transaction; rows locked at that instant are
    // simply not counted.
    // Waiting jobs (ready and delayed) count as ready when due, delayed when not, as in stats.
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
DECLARE @failures TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [Failed] bigint NOT NULL,
  [LeaseExpired] bigint NOT NULL);
INSERT INTO @ready ([Queue], [Ready], [Delayed], [Retrying], [Repeated], [OldestDue])
SELECT [Queue], COUNT_BIG(CASE WHEN [RunAt] <= @now THEN 1 END), COUNT_BIG(CASE WHEN [RunAt] > @now THEN 1 END),
       COUNT_BIG(CASE WHEN [Attempts] > 0 THEN 1 END), COUNT_BIG(CASE WHEN [Attempts] >= @repeated THEN 1 END),
       MIN(CASE WHEN [RunAt] <= @now THEN [RunAt] END)
FROM (SELECT [Queue], [RunAt], [Attempts] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [State] = 'ready'
      UNION ALL
      SELECT [Queue], [RunAt], [Attempts] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [State] = 'delayed') AS w
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
       ISNULL(r.[Repeated], 0) + ISNULL(l.[Repeated], 0) AS [RepeatedlyFailing],
       ISNULL(f.[Failed], 0) AS [RecentFailures], ISNULL(f.[LeaseExpired], 0) AS [RecentLeaseExpiries],
       ISNULL(DATEDIFF_BIG(millisecond, r.[OldestDue], @now), 0) AS [OldestReadyAgeMs]
FROM (SELECT [Queue] FROM @ready UNION SELECT [Queue] FROM @leased UNION SELECT [Queue] FROM @dead
      UNION SELECT [Queue] FROM @failures) AS q
LEFT JOIN @ready AS r ON r.[Queue] = q.[Queue]
LEFT JOIN @leased AS l ON l.[Queue] = q.[Queue]
LEFT JOIN @dead AS d ON d.[Queue] = q.[Queue]
LEFT JOIN @failures AS f ON f.[Queue] = q.[Queue]
ORDER BY q.[Queue];`,
  };
}
