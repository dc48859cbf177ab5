// Enqueue: single, bulk and grouped inserts, in the caller's transaction or their own, with the
// idempotency-key and group locks; recorded queue settings.
import { quoteMssqlIdentifier } from '../mssql.identifiers.js';
import { activateGroups, GROUP_HEADS, groupLockResource, lowestPerGroupInto, waitingFor } from './groups.queries.js';
import {
  atomically,
  MSSQL_CALLER_TRANSACTION_GONE,
  MSSQL_STORE_SESSION,
  OPEN_TRANSACTION_THROW,
  SESSION_SETTINGS,
} from './session.js';
import { shiftedNow, takeKeyLock } from './shared.js';
import type { MssqlTables } from './tables.js';

// @queue, @payload, @priority, @runAt (null: now + @delayMs), @delayMs bigint, @groupKey,
// @idempotencyKey, @concurrencyKey, @maxAttempts (null: the queue's recorded setting), @defaultMaxAttempts,
// @traceContext, @inTransaction (1: the caller's open transaction; see ENQUEUE_SESSION and keyedWork).
// The setting is read into a variable first: COALESCE((subquery), …) runs the subquery twice.
// With a key: the key's lock, then the existence check; the job's id is the existing one or
// the reserved one, and nothing is read again after the insert.
export function enqueueOne(t: MssqlTables): string {
  return enqueueStatements(t.schema).enqueueOne(false);
}

// ROWLOCK on both enqueue statements: READPAST skips locked rows but not locked pages, so
// a large insert in a caller's long transaction must not take page locks that claims and
// monitoring reads would then wait on (lock escalation is already off for the table).
// @jobs JobInputListV4 with Ord = 0..n-1, @inTransaction. A range of ids is reserved first, so
// every input row knows its id (first + Ord) whether or not it is inserted, and results come
// back in input order. The first row of a key within the batch is the one inserted; later
// ones get its id. First rows are found in one pass (ROW_NUMBER over the key: the table type
// has no index on the key and SQL Server keeps no statistics on a TVP, so a correlated
// "no earlier row" check could run once per row against every row). @keys is keyed by
// (Queue, IdempotencyKey) so the joins below seek it. Key locks are taken one per distinct
// resource, in resource order (@locks), the same order in every producer.
// A row without its own MaxAttempts takes its queue's recorded setting, else its default.
export function enqueueMany(t: MssqlTables): string {
  return enqueueStatements(t.schema).enqueueMany(false);
}

// The same for a job with a group key, which joins its group after the insert
// (activateGroups, for one job). The job's run time is read back, not computed again.
export function enqueueOneGrouped(t: MssqlTables): string {
  return enqueueStatements(t.schema).enqueueOne(true);
}

// The same when a job has a group key: each group's lowest new job joins it (activateGroups).
export function enqueueManyGrouped(t: MssqlTables): string {
  return enqueueStatements(t.schema).enqueueMany(true);
}

// @queue, @maxAttempts, @groupOnDead ('continue' | 'block'), the flow limits (@globalConcurrency,
// @concurrencyPerKey, @rateMax, @ratePerMs, @keyRateMax, @keyRatePerMs; null: none): insert or
// update one queue's settings (the last consumer to boot wins, as on PostgreSQL). The UPDATE's UPDLOCK + HOLDLOCK hold the key (or, when it is missing, its range)
// until commit, so two processes recording the same new queue at once serialize: the second
// updates the row the first inserted instead of failing on the primary key. (Boot-time only:
// the range lock on a missing queue costs nothing here.)
export function recordQueueSetting(t: MssqlTables): string {
  const { settings } = t;
  return `${MSSQL_STORE_SESSION}${atomically(`  UPDATE ${settings} WITH (UPDLOCK, HOLDLOCK)
  SET [MaxAttempts] = @maxAttempts, [GroupOnDead] = @groupOnDead, [GlobalConcurrency] = @globalConcurrency,
      [ConcurrencyPerKey] = @concurrencyPerKey, [RateMax] = @rateMax, [RatePerMs] = @ratePerMs, [KeyRateMax] = @keyRateMax,
      [KeyRatePerMs] = @keyRatePerMs, [UpdatedAt] = SYSUTCDATETIME()
  WHERE [Queue] = @queue;
  IF @@ROWCOUNT = 0
    INSERT INTO ${settings} ([Queue], [MaxAttempts], [GroupOnDead], [GlobalConcurrency], [ConcurrencyPerKey], [RateMax], [RatePerMs],
                             [KeyRateMax], [KeyRatePerMs])
    VALUES (@queue, @maxAttempts, @groupOnDead, @globalConcurrency, @concurrencyPerKey, @rateMax, @ratePerMs, @keyRateMax,
            @keyRatePerMs);`)}`;
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
                                        [TraceContext], [ConcurrencyKey])
    VALUES (@firstId, @queue, ${stateFor(oneRunAt)}, @payload, @priority, ${oneRunAt}, @groupKey, @idempotencyKey, @jobMaxAttempts,
            @traceContext, @concurrencyKey);
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
                                      [TraceContext], [ConcurrencyKey])
  OUTPUT ${grouped ? 'inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[RunAt], inserted.[Priority] INTO @inserted ([Id], [Queue], [GroupKey], [RunAt], [Priority])' : 'inserted.[Id] INTO @inserted ([Id])'}
  SELECT @firstId + i.[Ord], i.[Queue], ${stateFor(manyRunAt)}, i.[Payload], i.[Priority],
         ${manyRunAt},
         i.[GroupKey], i.[IdempotencyKey], COALESCE(i.[MaxAttempts], q.[MaxAttempts], i.[DefaultMaxAttempts]),
         i.[TraceContext], i.[ConcurrencyKey]
  FROM @jobs AS i
  LEFT JOIN @keys AS k ON k.[Queue] = i.[Queue] AND k.[IdempotencyKey] = i.[IdempotencyKey]
  LEFT JOIN ${settings} AS q ON q.[Queue] = i.[Queue]
  WHERE i.[IdempotencyKey] IS NULL OR (k.[Ord] = i.[Ord] AND k.[ExistingId] IS NULL);${grouped ? joinGroupsMany : ''}`)}`;
  // Each input row's job: the one inserted for it, the one its key found, or the one inserted for
  // an earlier row of its key in the batch.
  const answerId = `CASE WHEN n.[Id] IS NOT NULL THEN n.[Id] WHEN k.[ExistingId] IS NOT NULL THEN k.[ExistingId]
                 ELSE @firstId + k.[Ord] END`;
  const answerCreated = 'CASE WHEN n.[Id] IS NULL THEN 0 ELSE 1 END';
  const answerFrom = `FROM @jobs AS i
LEFT JOIN @inserted AS n ON n.[Id] = @firstId + i.[Ord]
LEFT JOIN @keys AS k ON k.[Queue] = i.[Queue] AND k.[IdempotencyKey] = i.[IdempotencyKey]`;
  const enqueueMany = (grouped: boolean) => `${ENQUEUE_SESSION}${ENQUEUE_NOW}${enqueueManyBody(grouped)}
SELECT i.[Ord],
       CAST(${answerId} AS varchar(20)) AS [Id],
       CAST(${answerCreated} AS bit) AS [Created]
${answerFrom}
ORDER BY i.[Ord];`;
  // The Enqueue procedure's work on its one-row @jobs (see mssqlEnqueueProcedureBody).
  const enqueueOneRow = `${ENQUEUE_SESSION}${ENQUEUE_NOW}${enqueueManyBody(true)}
SELECT @JobId = ${answerId},
       @Created = ${answerCreated}
${answerFrom};`;
  return { enqueueOne, enqueueMany, enqueueManyBody, enqueueOneRow };
}

/**
 * The Enqueue procedure's enqueue (queries/enqueue-procedure.queries.ts), after its checks: the
 * grouped enqueueMany on the one row of table variable @jobs (JobInputListV4, Ord 0), joining the
 * caller's transaction when there is one (@inTransaction, which the procedure declares) and else
 * in one of its own, into its OUTPUT parameters @JobId and @Created.
 */
export function mssqlEnqueueProcedureBody(schema: string): string {
  return enqueueStatements(schema).enqueueOneRow;
}

/**
 * The work of enqueueManyGrouped on the jobs of table variable @jobs (JobInputListV4, Ord 0..n-1,
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
