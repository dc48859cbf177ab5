// Job control: pausing and resuming queues, canceling jobs.
import { settleGroups, TOUCHED_GROUPS } from './groups.queries.js';
import { atomically, MSSQL_STORE_SESSION } from './session.js';
import type { MssqlTables } from './tables.js';

// @queue, @reason. A row when this statement paused the queue; none when it was paused already
// (the first pause and its reason stay). UPDLOCK, HOLDLOCK keep the key, or the range it would go
// in, to the end of the statement, so two pauses of one queue at once serialize: the second sees
// the first one's row and inserts nothing, instead of failing on the primary key.
export function pauseQueue(t: MssqlTables): string {
  const { pauses } = t;
  return `${MSSQL_STORE_SESSION}INSERT INTO ${pauses} ([Queue], [Reason])
OUTPUT inserted.[Queue]
SELECT @queue, @reason
WHERE NOT EXISTS (SELECT 1 FROM ${pauses} WITH (UPDLOCK, HOLDLOCK) WHERE [Queue] = @queue);`;
}

// @queue. A row when the queue was paused.
export function resumeQueue(t: MssqlTables): string {
  const { pauses } = t;
  return `${MSSQL_STORE_SESSION}DELETE FROM ${pauses}
OUTPUT deleted.[Queue]
WHERE [Queue] = @queue;`;
}

// READPAST, as the claims read pauses: a pause not committed yet is not listed.
export function listPausedQueues(t: MssqlTables): string {
  const { pauses } = t;
  return `${MSSQL_STORE_SESSION}SELECT [Queue], [Reason], [PausedAt]
FROM ${pauses} WITH (READPAST, READCOMMITTEDLOCK)
ORDER BY [Queue];`;
}

// @ids IdList, @reason. In one transaction: a ready or delayed job becomes canceled; a leased one
// keeps running and is marked (the first request's time and reason stay), for its owner's
// heartbeat. The groups of the canceled jobs are settled as after a completion (settleGroups,
// under a token no job has, so only a group held by nobody and not blocked moves on: headed by its
// next job, or deleted when none is left); a group another token holds is left to its holder.
// As every transition, the job writes come before the group rows are locked: a claim that holds
// a group row reads its jobs with READPAST and never waits for the canceled one, so the two never
// wait on each other. A job already finished is reported with its state, unchanged.
export function cancel(t: MssqlTables): string {
  const { jobs, groups } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @canceled TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [State] varchar(8) NOT NULL);
${TOUCHED_GROUPS}${atomically(`  UPDATE j
  SET [State] = CASE WHEN j.[State] = 'leased' THEN 'leased' ELSE 'canceled' END,
      [FinishedAt] = CASE WHEN j.[State] = 'leased' THEN j.[FinishedAt] ELSE SYSUTCDATETIME() END,
      [CancelRequestedAt] = ISNULL(j.[CancelRequestedAt], SYSUTCDATETIME()),
      [CancelReason] = CASE WHEN j.[CancelRequestedAt] IS NULL THEN @reason ELSE j.[CancelReason] END
  OUTPUT inserted.[Id], inserted.[Queue], inserted.[GroupKey], inserted.[State]
  INTO @canceled ([Id], [Queue], [GroupKey], [State])
  FROM ${jobs} AS j WITH (ROWLOCK)
  INNER JOIN @ids AS i ON j.[Id] = i.[Id]
  WHERE j.[State] IN ('ready', 'delayed', 'leased');
  IF EXISTS (SELECT 1 FROM @canceled WHERE [GroupKey] IS NOT NULL AND [State] = 'canceled')
  BEGIN
    INSERT INTO @touched ([Queue], [GroupKey], [Token])
    SELECT g.[Queue], g.[GroupKey], NEWID()
    FROM (SELECT DISTINCT [Queue], [GroupKey] FROM @canceled WHERE [GroupKey] IS NOT NULL AND [State] = 'canceled') AS g;
${settleGroups(jobs, groups)}
  END;`)}
SELECT CAST(i.[Id] AS varchar(20)) AS [Id],
  CASE WHEN c.[State] = 'canceled' THEN 'canceled' WHEN c.[State] = 'leased' THEN 'canceling'
       WHEN f.[Id] IS NOT NULL THEN 'finished' ELSE 'missing' END AS [Outcome],
  COALESCE(c.[State], CASE WHEN f.[State] IN ('done', 'dead', 'canceled') THEN f.[State] END) AS [State],
  COALESCE(c.[Queue], f.[Queue]) AS [Queue]
FROM @ids AS i
LEFT JOIN @canceled AS c ON c.[Id] = i.[Id]
LEFT JOIN ${jobs} AS f ON f.[Id] = i.[Id] AND c.[Id] IS NULL;`;
}

// @queue, @key: one seek on UX_Jobs_Idempotency.
export function findJobByKey(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}SELECT CAST([Id] AS varchar(20)) AS [Id] FROM ${jobs} WHERE [Queue] = @queue AND [IdempotencyKey] = @key;`;
}
