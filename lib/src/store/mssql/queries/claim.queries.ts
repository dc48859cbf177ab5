// Claim and completion: the READPAST claim (ungrouped and ordered groups), heartbeats, complete,
// fail and give-back, and the claimable-work probe.
import {
  blockingJob,
  CLAIMABLE_GROUP,
  firstUnfinished,
  movedJobsTable,
  settleGroups,
  settleMovedGroups,
  STALE_HEAD_PAUSE_MS,
  TOUCHED_GROUPS,
  WAITING_GROUP,
} from './groups.queries.js';
import { atomically, MSSQL_STORE_SESSION, MSSQL_STORE_TRANSACTION_SESSION } from './session.js';
import { CLAIM_HINTS, HAS_LIMITS, isPaused } from './shared.js';
import type { MssqlTables } from './tables.js';

// A leased job cancel() marked never goes back to waiting: where it would (a give-back, a batch
// sibling given back), it is canceled instead, final.
function backOrCanceled(j: string): string {
  return `CASE WHEN ${j}.[CancelRequestedAt] IS NOT NULL THEN 'canceled' ELSE 'ready' END`;
}

function canceledNow(j: string): string {
  return `CASE WHEN ${j}.[CancelRequestedAt] IS NOT NULL THEN SYSUTCDATETIME() END`;
}

/** The claimed jobs of a claim batch, which CLAIMED_ROWS returns. */
export const CLAIMED_TABLE = `DECLARE @claimed TABLE (
  [Id] bigint NOT NULL, [Queue] nvarchar(128) NOT NULL, [Payload] nvarchar(max) NOT NULL, [Priority] int NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [IdempotencyKey] nvarchar(255) NULL, [Attempts] int NOT NULL,
  [MaxAttempts] int NOT NULL, [ClaimToken] uniqueidentifier NOT NULL, [CreatedAt] datetime2(3) NOT NULL,
  [ClaimedAt] datetime2(3) NOT NULL, [LeaseUntil] datetime2(3) NOT NULL,
  [UnitPriority] int NULL, [UnitAt] datetime2(3) NULL, [UnitId] bigint NOT NULL, [TraceContext] varchar(2048) NULL,
  [ConcurrencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL);
`;

/** The answer of a claim batch: its jobs in claim order (a group's batch in id order). */
export const CLAIMED_ROWS = `SELECT CAST([Id] AS varchar(20)) AS [Id], [Queue], [Payload], [Priority], [GroupKey], [IdempotencyKey], [Attempts], [MaxAttempts],
       CAST([ClaimToken] AS char(36)) AS [ClaimToken], [CreatedAt], [ClaimedAt], [LeaseUntil], [TraceContext], [ConcurrencyKey]
FROM @claimed
ORDER BY [UnitPriority] DESC, [UnitAt], [UnitId], [Id];`;

/**
 * The SET of a lease and its OUTPUT into @claimed (CLAIMED_TABLE's columns, in order), lines
 * indented by `indent`: `token` the new claim token, `attempts` the column counted up, `unit` the
 * claim unit's priority, time and id the answer is ordered by.
 */
export function leaseAndAnswer(
  clock: LeaseClock,
  lease: { token: string; attempts: string; unit: string },
  indent: string,
): string {
  return `SET [State] = 'leased', [ClaimToken] = ${lease.token}, [Attempts] = ${lease.attempts} + 1,
    [LeaseUntil] = DATEADD(millisecond, @leaseMs, ${clock.leaseAt}), [ClaimedAt] = ${clock.leaseAt}, [WorkerId] = @workerId
OUTPUT inserted.[Id], inserted.[Queue], inserted.[Payload], inserted.[Priority], inserted.[GroupKey], inserted.[IdempotencyKey],
       inserted.[Attempts], inserted.[MaxAttempts], inserted.[ClaimToken], inserted.[CreatedAt], inserted.[ClaimedAt],
       inserted.[LeaseUntil], ${lease.unit}, inserted.[TraceContext], inserted.[ConcurrencyKey]
INTO @claimed`
    .split('\n')
    .map((line) => indent + line)
    .join('\n');
}

/** The time a lease starts at: SYSUTCDATETIME() in the ordinary claim, the flow claim's @leaseAt in its. */
interface LeaseClock {
  leaseAt: string;
}

const STATEMENT_CLOCK: LeaseClock = { leaseAt: 'SYSUTCDATETIME()' };

// A claim's ungrouped jobs without a concurrency key (@jobUnits of them): the seed's READPAST
// claim of the ready index (IX_Jobs_Claim, which holds neither grouped nor keyed jobs).
function candidateJobs(t: MssqlTables, clock: LeaseClock): string {
  const { jobs } = t;
  return `  WITH candidate AS (
    SELECT TOP (@jobUnits) *
    FROM ${jobs} WITH (${CLAIM_HINTS})
    WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
    ORDER BY [Priority] DESC, [RunAt], [Id]
  )
  UPDATE candidate
${leaseAndAnswer(clock, { token: 'NEWID()', attempts: '[Attempts]', unit: 'inserted.[Priority], inserted.[RunAt], inserted.[Id]' }, '  ')};`;
}

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
function groupClaim(t: MssqlTables, clock: LeaseClock, inTransaction: (body: string) => string): string {
  const { jobs, groups } = t;
  return `  DECLARE @held TABLE (
    [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [HeadId] bigint NOT NULL,
    [HeadPriority] int NULL, [HeadReadyAt] datetime2(3) NULL, [Token] uniqueidentifier NOT NULL, [LastId] bigint NULL);
  DECLARE @window TABLE (
    [Id] bigint NOT NULL PRIMARY KEY, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL, [Seq] bigint NOT NULL);
  DECLARE @members TABLE (
    [Id] bigint NOT NULL PRIMARY KEY, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    [Seq] bigint NOT NULL, [Runnable] bit NOT NULL);
${inTransaction(`${candidateJobs(t, clock)}
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
${leaseAndAnswer(clock, { token: 'h.[Token]', attempts: 'j.[Attempts]', unit: 'h.[HeadPriority], h.[HeadReadyAt], h.[HeadId]' }, '  ')}
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
}

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
export function claim(t: MssqlTables): string {
  const { jobs, pauses, settings } = t;
  return `${MSSQL_STORE_SESSION}${CLAIMED_TABLE}DECLARE @handOver bit = CASE WHEN EXISTS (
  SELECT 1 FROM ${settings} AS s WHERE s.[Queue] = @queue AND ${HAS_LIMITS}) THEN 1 ELSE 0 END;
-- A paused queue leases nothing: every TOP below takes 0 rows. Nor does a queue whose consumers
-- recorded flow limits: only the flow claim applies them (flow.queries.ts).
SET @limit = CASE WHEN ${isPaused(pauses, '@queue')} OR @handOver = 1 THEN 0 ELSE @limit END;
${claimUnits(t, STATEMENT_CLOCK, atomically)}
${CLAIMED_ROWS}
-- Keyed ready jobs are not this batch's (they wait in IX_Jobs_KeyReady, outside its reads), nor is
-- a queue with recorded limits: a second result says so, and the store takes the queue's flow
-- claim from then on.
IF @handOver = 1 OR EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'ready' AND [ConcurrencyKey] IS NOT NULL
)
  SELECT CAST(1 AS bit) AS [FlowClaim];`;
}

/**
 * Up to `top` due delayed jobs without a group made ready, oldest first (keyed ones included: a
 * concurrency key is never combined with a group), as its own statement, so that the reads after
 * it see them. Each line starts with `indent`.
 */
export function promoteDueJobs(jobs: string, top: string, indent: string): string {
  return `WITH due AS (
  SELECT TOP (${top}) *
  FROM ${jobs} WITH (${CLAIM_HINTS})
  WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
  ORDER BY [RunAt], [Id]
)
UPDATE due
SET [State] = 'ready';`
    .split('\n')
    .map((line) => indent + line)
    .join('\n');
}

/**
 * The claim's work on @limit units (the caller sets @limit; @claimed declared): the promotions,
 * the count of group units, and the leases, without a session prefix or an answer. The ordinary
 * claim runs the group side in a transaction of its own (`inTransaction` = atomically); the
 * flow claim, already in its transaction, runs it as it is.
 */
export function claimUnits(t: MssqlTables, clock: LeaseClock, inTransaction: (body: string) => string): string {
  const { jobs, groups } = t;
  return `DECLARE @groupUnits int = 0, @jobUnits int;
${promoteDueJobs(jobs, '@limit', '')}
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
        WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL
          AND [RunAt] <= SYSUTCDATETIME()
        ORDER BY [Priority] DESC, [RunAt], [Id]) AS j
    ) AS u
    ORDER BY u.[Priority] DESC, u.[RunAt], u.[Id]
  ) AS best
  WHERE best.[Kind] = 1;
-- No claimable group: the ungrouped claim alone, in autocommit, as before ordered groups.
IF @groupUnits = 0
BEGIN
  SET @jobUnits = @limit;
${candidateJobs(t, clock)}
END
ELSE
BEGIN
  SET @jobUnits = @limit - @groupUnits;
${groupClaim(t, clock, inTransaction)}
END;`;
}

// @items HeartbeatListV2 (Progress: JSON text reported since the last write, or NULL: unchanged).
// The lease never runs past ClaimedAt + MaxMs; once that cap has passed
// the lease cannot be renewed, and the answer is no lease (lost), not 'ok'. A job cancel()
// marked comes back with its cancel request, its lease still renewed (fenced while its owner
// records the cancellation).
export function heartbeat(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @extended TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [LeaseUntil] datetime2(3) NOT NULL, [CancelRequestedAt] datetime2(3) NULL,
  [CancelReason] nvarchar(1000) NULL);
UPDATE j
SET [Progress] = ISNULL(i.[Progress], j.[Progress]),
    [LeaseUntil] = CASE
    WHEN i.[MaxMs] IS NULL OR DATEADD(millisecond, i.[LeaseMs], SYSUTCDATETIME()) < DATEADD(millisecond, i.[MaxMs], j.[ClaimedAt])
      THEN DATEADD(millisecond, i.[LeaseMs], SYSUTCDATETIME())
    ELSE DATEADD(millisecond, i.[MaxMs], j.[ClaimedAt]) END
OUTPUT inserted.[Id], inserted.[LeaseUntil], inserted.[CancelRequestedAt], inserted.[CancelReason]
INTO @extended ([Id], [LeaseUntil], [CancelRequestedAt], [CancelReason])
FROM ${jobs} AS j WITH (ROWLOCK)
INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
WHERE j.[State] = 'leased';
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], CASE WHEN e.[LeaseUntil] > SYSUTCDATETIME() THEN e.[LeaseUntil] END AS [LeaseUntil],
       CAST(CASE WHEN e.[CancelRequestedAt] IS NOT NULL THEN 1 ELSE 0 END AS bit) AS [Cancel], e.[CancelReason]
FROM @items AS i LEFT JOIN @extended AS e ON e.[Id] = i.[Id];`;
}

// @items CompletionList (each job with its handler's result as JSON text, or NULL). The token
// stays on the done row, so a retried completion whose first reply was lost is recognised
// ('already') instead of reported as lost. A grouped job's group
// is settled in the same transaction (settleGroups): released once no job of its batch is
// leased any more, headed by its next job.
export function complete(t: MssqlTables): string {
  return completion(t, MSSQL_STORE_SESSION, atomically);
}

// @items CompletionList (one job): complete's change inside a transactional handler's
// transaction, the store's own, which commits it with the handler's writes (or rolls it back).
export function completeInTransaction(t: MssqlTables): string {
  return completion(t, MSSQL_STORE_TRANSACTION_SESSION, (change) => change);
}

function completion(t: MssqlTables, session: string, inTransaction: (change: string) => string): string {
  const { jobs, groups } = t;
  return `${session}${movedJobsTable('@completed')}${TOUCHED_GROUPS}${inTransaction(`  UPDATE j
  SET [State] = 'done', [FinishedAt] = SYSUTCDATETIME(), [LeaseUntil] = NULL, [Result] = i.[Result],
      [Progress] = ISNULL(i.[Progress], j.[Progress])
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
FROM @items AS i LEFT JOIN @completed AS c ON c.[Id] = i.[Id];`;
}

// @items FailureList. The state change and its attempt row commit together. A retry with a
// delay waits as 'delayed' (out of the claim's ready index); the claim promotes it once due.
// A grouped job's batch siblings (leased with its token, never started) go back to ready
// with their attempt given back, and its group is settled: headed by the failed job again
// (a retry keeps its place), or, when it died, by the next job ('continue') or stopped by it
// ('block', the queue's recorded groupOnDead; 'continue' when none is recorded).
export function fail(t: MssqlTables): string {
  return failure(t, 'failed');
}

// @items FailureList: owners acknowledging cancellations (cancel() marked their leased jobs).
// The same transition as fail, to the final state 'canceled' with a 'canceled' attempt, never
// retried and never blocking its group, which moves on as after a completion.
export function cancelAck(t: MssqlTables): string {
  return failure(t, 'canceled');
}

function failure(t: MssqlTables, outcome: 'failed' | 'canceled'): string {
  const { jobs, attempts, settings, groups } = t;
  // A job cancel() marked is never retried: its failure (its owner had not heard of the
  // cancellation yet) ends it canceled too.
  const ends =
    outcome === 'canceled'
      ? '1 = 1'
      : 'j.[CancelRequestedAt] IS NOT NULL OR i.[Dead] = 1 OR j.[Attempts] >= j.[MaxAttempts]';
  const state =
    outcome === 'canceled'
      ? "'canceled'"
      : `CASE WHEN j.[CancelRequestedAt] IS NOT NULL THEN 'canceled' WHEN ${ends} THEN 'dead'
                     WHEN i.[DelayMs] > 0 THEN 'delayed' ELSE 'ready' END`;
  const runAt =
    outcome === 'canceled'
      ? 'j.[RunAt]'
      : `CASE WHEN ${ends} THEN j.[RunAt]
                     ELSE DATEADD(millisecond, i.[DelayMs], SYSUTCDATETIME()) END`;
  const finishedAt =
    outcome === 'canceled' ? 'SYSUTCDATETIME()' : `CASE WHEN ${ends} THEN SYSUTCDATETIME() ELSE NULL END`;
  const touched =
    outcome === 'canceled'
      ? `    INSERT INTO @touched ([Queue], [GroupKey], [Token], [BlockId])
    SELECT DISTINCT f.[Queue], f.[GroupKey], f.[Token], NULL
    FROM @failed AS f
    WHERE f.[GroupKey] IS NOT NULL;`
      : `    INSERT INTO @touched ([Queue], [GroupKey], [Token], [BlockId])
    SELECT f.[Queue], f.[GroupKey], f.[Token], ${blockingJob('f')}
    FROM @failed AS f LEFT JOIN ${settings} AS q ON q.[Queue] = f.[Queue]
    WHERE f.[GroupKey] IS NOT NULL
    GROUP BY f.[Queue], f.[GroupKey], f.[Token];`;
  return `${MSSQL_STORE_SESSION}DECLARE @failed TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [State] varchar(8) NOT NULL, [Attempt] int NOT NULL,
  [ClaimedAt] datetime2(3) NULL, [Token] uniqueidentifier NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL);
DECLARE @batchTokens TABLE ([Token] uniqueidentifier NOT NULL PRIMARY KEY);
${TOUCHED_GROUPS}${atomically(`  UPDATE j
  SET [State] = ${state},
      [RunAt] = ${runAt},
      [FinishedAt] = ${finishedAt},
      [ClaimToken] = NULL, [LeaseUntil] = NULL, [LastError] = i.[Error]
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[State], inserted.[Attempts], inserted.[ClaimedAt], deleted.[ClaimToken],
         inserted.[GroupKey]
  INTO @failed ([Id], [Queue], [State], [Attempt], [ClaimedAt], [Token], [GroupKey])
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
  WHERE j.[State] = 'leased';
  INSERT INTO ${attempts} WITH (ROWLOCK) ([JobId], [Queue], [Attempt], [Outcome], [Error], [Stack], [WorkerId], [ClaimToken], [StartedAt], [FinishedAt])
  SELECT f.[Id], f.[Queue], f.[Attempt], '${outcome}', i.[Error], i.[Stack], i.[WorkerId], f.[Token], f.[ClaimedAt], SYSUTCDATETIME()
  FROM @failed AS f INNER JOIN @items AS i ON i.[Id] = f.[Id];
  IF EXISTS (SELECT 1 FROM @failed WHERE [GroupKey] IS NOT NULL)
  BEGIN
    INSERT INTO @batchTokens ([Token]) SELECT DISTINCT [Token] FROM @failed WHERE [GroupKey] IS NOT NULL;
    UPDATE s
    SET [State] = ${backOrCanceled('s')}, [FinishedAt] = ${canceledNow('s')},
        [Attempts] = CASE WHEN s.[Attempts] > 0 THEN s.[Attempts] - 1 ELSE 0 END, [ClaimToken] = NULL,
        [LeaseUntil] = NULL, [ClaimedAt] = NULL, [WorkerId] = NULL
    FROM ${jobs} AS s WITH (ROWLOCK)
    INNER JOIN @batchTokens AS b ON s.[ClaimToken] = b.[Token]
    WHERE s.[State] = 'leased' AND s.[GroupKey] IS NOT NULL;
${touched}
${settleGroups(jobs, groups)}
  END;`)}
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], f.[State],
  CASE WHEN f.[Id] IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${attempts} AS a WHERE a.[JobId] = i.[Id] AND a.[ClaimToken] = i.[Token] AND a.[Outcome] = '${outcome}') THEN 'already'
       ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @failed AS f ON f.[Id] = i.[Id];`;
}

// @items OwnedJobList: leased but never started; the claim's attempt is given back. A
// grouped job's group is settled as after a completion (released once no job of the batch
// is leased, headed by its lowest unfinished job: the released one comes next).
export function release(t: MssqlTables): string {
  return giveBack(t, false);
}

// @items FailureList (its DelayMs; a table type cannot grow a column, and this one has it): jobs
// their handlers postponed (a rate limit met outside): given back as release does, the attempt
// not counted, but delayed for DelayMs; the claim promotes them once due, and a group waits.
export function postpone(t: MssqlTables): string {
  return giveBack(t, true);
}

// Under rateLimitPerKey a postponed job's whole key waits (the outside limit is the key's): its
// FlowState row (Lane = the key) holds the latest wait, which flow claims respect. The row is
// made if missing under UPDLOCK + HOLDLOCK (a concurrent postpone of the key waits for it, then
// updates it), then moved to the later of the two waits.
function keyWaits(t: MssqlTables): string {
  const { jobs, settings, flowState } = t;
  return `
  IF EXISTS (SELECT 1 FROM @released AS r INNER JOIN ${jobs} AS j ON j.[Id] = r.[Id]
             WHERE j.[ConcurrencyKey] IS NOT NULL AND j.[State] = 'delayed')
  BEGIN
    INSERT INTO @keyWaits ([Queue], [Lane], [Until])
    SELECT j.[Queue], j.[ConcurrencyKey], MAX(j.[RunAt])
    FROM @released AS r INNER JOIN ${jobs} AS j ON j.[Id] = r.[Id]
    WHERE j.[ConcurrencyKey] IS NOT NULL AND j.[State] = 'delayed'
      AND EXISTS (SELECT 1 FROM ${settings} AS s WHERE s.[Queue] = j.[Queue] AND s.[KeyRateMax] IS NOT NULL)
    GROUP BY j.[Queue], j.[ConcurrencyKey];
    INSERT INTO ${flowState} WITH (ROWLOCK) ([Queue], [Lane], [BlockedUntil])
    SELECT w.[Queue], w.[Lane], w.[Until] FROM @keyWaits AS w
    WHERE NOT EXISTS (SELECT 1 FROM ${flowState} AS f WITH (UPDLOCK, HOLDLOCK) WHERE f.[Queue] = w.[Queue] AND f.[Lane] = w.[Lane]);
    UPDATE f
    SET [BlockedUntil] = CASE WHEN f.[BlockedUntil] > w.[Until] THEN f.[BlockedUntil] ELSE w.[Until] END, [UpdatedAt] = SYSUTCDATETIME()
    FROM ${flowState} AS f WITH (ROWLOCK)
    INNER JOIN @keyWaits AS w ON f.[Queue] = w.[Queue] AND f.[Lane] = w.[Lane];
  END;`;
}

function giveBack(t: MssqlTables, postponed: boolean): string {
  const { jobs, groups } = t;
  const state = postponed
    ? "CASE WHEN j.[CancelRequestedAt] IS NOT NULL THEN 'canceled' WHEN i.[DelayMs] > 0 THEN 'delayed' ELSE 'ready' END"
    : backOrCanceled('j');
  const runAt = postponed
    ? `
      [RunAt] = CASE WHEN j.[CancelRequestedAt] IS NULL AND i.[DelayMs] > 0
                     THEN DATEADD(millisecond, i.[DelayMs], SYSUTCDATETIME()) ELSE j.[RunAt] END,`
    : '';
  const waits = postponed
    ? `DECLARE @keyWaits TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [Lane] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Until] datetime2(3) NOT NULL, PRIMARY KEY ([Queue], [Lane]));
`
    : '';
  return `${MSSQL_STORE_SESSION}${movedJobsTable('@released')}${TOUCHED_GROUPS}${waits}${atomically(`  UPDATE j
  SET [State] = ${state},${runAt} [FinishedAt] = ${canceledNow('j')},
      [Attempts] = CASE WHEN j.[Attempts] > 0 THEN j.[Attempts] - 1 ELSE 0 END, [ClaimToken] = NULL,
      [LeaseUntil] = NULL, [ClaimedAt] = NULL, [WorkerId] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], deleted.[ClaimToken]
  INTO @released ([Id], [Queue], [GroupKey], [Token])
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @items AS i ON j.[Id] = i.[Id] AND j.[ClaimToken] = i.[Token]
  WHERE j.[State] = 'leased';${postponed ? keyWaits(t) : ''}
${settleMovedGroups('@released', jobs, groups)}`)}
SELECT CAST(i.[Id] AS varchar(20)) AS [Id], CASE WHEN r.[Id] IS NOT NULL THEN 'ok' ELSE 'lost' END AS [Outcome]
FROM @items AS i LEFT JOIN @released AS r ON r.[Id] = i.[Id];`;
}

// A due delayed job counts: the next claim promotes and takes it; so do a claimable group and
// a due waiting one (each a seek that stops at the first due row).
export function hasClaimableWork(t: MssqlTables): string {
  const { jobs, groups, pauses } = t;
  return `${MSSQL_STORE_SESSION}SELECT CAST(CASE WHEN ${isPaused(pauses, '@queue')} THEN 0 WHEN EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
) OR EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'ready' AND [ConcurrencyKey] IS NOT NULL
) OR EXISTS (
  SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()
) OR EXISTS (
  SELECT 1 FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND ${CLAIMABLE_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
) OR EXISTS (
  SELECT 1 FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @queue AND ${WAITING_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME()
) THEN 1 ELSE 0 END AS bit) AS [HasWork];`;
}
