// Maintenance: the lease reaper, retention, dead-job retry and purge, throughput retention.
import {
  activateGroups,
  blockingJob,
  firstUnfinished,
  GROUP_HEADS,
  lowestPerGroupInto,
  settleGroups,
  TOUCHED_GROUPS,
  waitingFor,
} from './groups.queries.js';
import { atomically, MSSQL_STORE_SESSION } from './session.js';
import { CLAIM_HINTS, shiftedNow } from './shared.js';
import type { MssqlTables } from './tables.js';

// retryDead's group side, after the jobs are ready again (@retried), in its transaction. A
// blocked group whose blocking job is retried is released, headed by the group's lowest
// retried job; any other retried job joins its group as a new one would (activateGroups).
function retryGroups(t: MssqlTables): string {
  const { groups, schema } = t;
  return `  IF EXISTS (SELECT 1 FROM @retried WHERE [GroupKey] IS NOT NULL)
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
}

// purgeDead and purgeDeadIds: the dead jobs of @queue finished before now - @olderThanMs,
// and `only` (one more condition on them), at most @batch; then their blocked groups released.
function purge(t: MssqlTables, only: string): string {
  const { jobs, groups } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @purged TABLE (
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
}

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
// already holds. Then the group is settled as after a failure. A job cancel() marked is
// canceled, not retried (its owner died before recording that), a never-started one included.
export function reap(t: MssqlTables): string {
  const { jobs, attempts, settings, groups } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @reaped TABLE (
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
  SET [State] = CASE WHEN [CancelRequestedAt] IS NOT NULL THEN 'canceled' WHEN [Attempts] >= [MaxAttempts] THEN 'dead' ELSE 'ready' END,
      [FinishedAt] = CASE WHEN [CancelRequestedAt] IS NOT NULL OR [Attempts] >= [MaxAttempts] THEN SYSUTCDATETIME() ELSE NULL END,
      [LastError] = CONCAT(N'lease expired at ', STUFF(CONVERT(char(23), [LeaseUntil], 121), 11, 1, 'T'), N'Z (worker ', COALESCE([WorkerId], N'unknown'), N')'),
      [ClaimToken] = NULL, [LeaseUntil] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[State], inserted.[Attempts], deleted.[ClaimToken], deleted.[WorkerId],
         deleted.[ClaimedAt], inserted.[LastError], inserted.[GroupKey], deleted.[LastError]
  INTO @reaped ([Id], [Queue], [State], [Attempt], [Token], [WorkerId], [ClaimedAt], [LastError], [GroupKey], [PriorError]);
  IF EXISTS (SELECT 1 FROM @reaped WHERE [GroupKey] IS NOT NULL)
  BEGIN
    INSERT INTO @batchTokens ([Token]) SELECT DISTINCT [Token] FROM @reaped WHERE [GroupKey] IS NOT NULL AND [Token] IS NOT NULL;
    UPDATE s
    SET [State] = CASE WHEN s.[CancelRequestedAt] IS NOT NULL THEN 'canceled' WHEN s.[Attempts] >= s.[MaxAttempts] THEN 'dead' ELSE 'ready' END,
        [FinishedAt] = CASE WHEN s.[CancelRequestedAt] IS NOT NULL OR s.[Attempts] >= s.[MaxAttempts] THEN SYSUTCDATETIME() ELSE NULL END,
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
    WHERE r.[Unstarted] = 1 AND r.[State] <> 'canceled';
    UPDATE r SET [State] = 'ready', [Attempt] = CASE WHEN r.[Attempt] > 0 THEN r.[Attempt] - 1 ELSE 0 END
    FROM @reaped AS r
    WHERE r.[Unstarted] = 1 AND r.[State] <> 'canceled';
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
SELECT CAST([Id] AS varchar(20)) AS [Id], [Queue], [State], [Attempt] FROM @reaped;`;
}

// @queue, @ids IdList. A retried job of an ordered group: see retryGroups.
export function retryDead(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}${RETRIED}${atomically(`  UPDATE j
  SET [State] = 'ready', [Attempts] = 0, [RunAt] = SYSUTCDATETIME(), [FinishedAt] = NULL, [ClaimToken] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[RunAt], inserted.[Priority]
  INTO @retried ([Id], [Queue], [GroupKey], [RunAt], [Priority])
  FROM ${jobs} AS j WITH (ROWLOCK) INNER JOIN @ids AS i ON i.[Id] = j.[Id]
  WHERE j.[Queue] = @queue AND j.[State] = 'dead';
${retryGroups(t)}`)}
SELECT CAST([Id] AS varchar(20)) AS [Id] FROM @retried;`;
}

// @queue, @afterId bigint (0 first), @batch. One keyset batch in Id order: lock escalation is
// off (migration 1), so an unbounded UPDATE would hold key locks on every dead row (PK,
// IX_Jobs_Dead, IX_Jobs_Claim) until it ends; the store loops, each batch its own
// transaction. The ordered TOP is the UPDATE page's recipe ("use TOP together with
// ORDER BY in a subselect", https://learn.microsoft.com/sql/t-sql/queries/update-transact-sql),
// a range seek on IX_Jobs_Dead ([Queue], [Id]) that stops after @batch rows; Id order is the
// order the other batched writers lock PK rows in. A job retried and dead again during the
// loop keeps its Id, below @afterId, so it is not retried twice.
export function retryAllDead(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}${RETRIED}${atomically(`  WITH batch AS (
    SELECT TOP (@batch) *
    FROM ${jobs} WITH (ROWLOCK)
    WHERE [Queue] = @queue AND [State] = 'dead' AND [Id] > @afterId
    ORDER BY [Id]
  )
  UPDATE batch
  SET [State] = 'ready', [Attempts] = 0, [RunAt] = SYSUTCDATETIME(), [FinishedAt] = NULL, [ClaimToken] = NULL
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[RunAt], inserted.[Priority]
  INTO @retried ([Id], [Queue], [GroupKey], [RunAt], [Priority]);
${retryGroups(t)}`)}
SELECT CAST([Id] AS varchar(20)) AS [Id] FROM @retried ORDER BY [Id];`;
}

// @queue, @olderThanMs bigint (0 for all), @batch. A group blocked by a purged job is
// released: its row is locked first, then headed by its lowest unfinished job (a dirty read,
// as in settleGroups), or deleted when it has none (purge, above).
export function purgeDead(t: MssqlTables): string {
  return purge(t, '');
}

// The same for the dead jobs among @ids (IdList, at most @batch of them): a seek per id.
export function purgeDeadIds(t: MssqlTables): string {
  return purge(t, '\n    AND [Id] IN (SELECT i.[Id] FROM @ids AS i)');
}

// @doneMs, @keyMs, @deadMs (null: keep dead jobs), @batch; all bigint milliseconds. At most
// @batch rows in all: each DELETE takes what the ones before it left of the budget, so a
// short answer means nothing old is left. Each DELETE is its own autocommit statement with
// a predicate a FinishedAt-led filtered index can answer as one range: keyless done rows,
// keyed done rows (kept until the key window passes too), dead rows. A dead job that blocks
// its ordered group stays until it is retried or purged: deleting it would leave the group
// blocked by nothing (IX_Jobs_DeadFinished carries Queue and GroupKey for this check).
export function cleanup(t: MssqlTables): string {
  const { jobs, groups } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @deleted int = 0;
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
IF @deleted < @batch
BEGIN
  -- Canceled jobs are kept as done ones are (IX_Jobs_Canceled).
  DELETE TOP (@batch - @deleted) FROM ${jobs} WITH (ROWLOCK)
  WHERE [State] = 'canceled' AND [FinishedAt] < @doneBefore
    AND ([IdempotencyKey] IS NULL OR [FinishedAt] < @keyedDoneBefore);
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
SELECT @deleted AS [Deleted];`;
}

// @retentionMs bigint, @batch. The oldest buckets past the retention, at most @batch of them:
// one range at the start of PK_Throughput.
export function cleanupThroughput(t: MssqlTables): string {
  const { throughput } = t;
  return `${MSSQL_STORE_SESSION}DELETE TOP (@batch) FROM ${throughput} WITH (ROWLOCK)
WHERE [Minute] < ${shiftedNow('@retentionMs', -1)};`;
}

/** retryDead's record of the jobs it made ready again, and activateGroups' declarations. */
const RETRIED = `DECLARE @retried TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [RunAt] datetime2(3) NOT NULL, [Priority] int NOT NULL);
DECLARE @resource nvarchar(255), @lock int, @refused nvarchar(2048);
${GROUP_HEADS}`;
