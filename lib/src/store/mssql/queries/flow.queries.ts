// Flow control (issue 24) on SQL Server: the claim of a queue with limits or concurrency keys, as
// one batch (one round trip), and the reads and retention around it. The semantics are
// PostgreSQL's (store/postgres/queries/flow.queries.ts); what differs is how SQL Server holds them:
//   1. The lock: the queue's FlowState row (Lane N''), read WITH (UPDLOCK, ROWLOCK) inside the
//      claim's transaction. "UPDLOCK: update locks are taken and held until the transaction
//      completes", and update locks are incompatible with each other, so flow claims of a queue
//      take turns across every instance, each waiting (never skipping: a skip would read as "no
//      work") for the one before it to commit. Live server fact: flow-lock in
//      test/integration/mssql/server-facts-flow.mssql.spec.ts.
//   2. Counts, in statements after the lock: leased rows (a slot is a leased row, freed with its
//      lease however it ends, so nothing can drift) read without READPAST, which would undercount
//      a row a heartbeat holds; under READ_COMMITTED_SNAPSHOT a statement's snapshot is taken when
//      it starts, after the lock, so it sees every lease the previous holder committed, and under
//      locking READ COMMITTED the read waits for a writer instead. Both databases run the live
//      contract.
//   3. Rate windows: one FlowStarts row per start (SQL Server has no arrays), counted by a seek on
//      (Queue, Lane, At) and pruned by the claim that adds to the window.
//   4. Keys in turn: a WHILE loop of TOP (1) seeks on IX_Jobs_KeyReady from the cursor (one seek
//      per key, however many jobs a key holds), wrapping around once; each key's room is its free
//      slots, its window's free starts and an equal share of the budget; jobs are taken round by
//      round across the keys, by priority within a key.
// A lease's ClaimedAt is @leaseAt: the clock read after the counts it leased against (so no
// completion it counted as done ended after it), rounded up to the millisecond (ClaimedAt is
// datetime2(3); rounding down could put a start before the window edge its claim checked), and
// the same value is the start recorded in the windows.
import { claimUnits, CLAIMED_ROWS, CLAIMED_TABLE, leaseAndAnswer, promoteDueJobs } from './claim.queries.js';
import { CLAIMABLE_GROUP, WAITING_GROUP } from './groups.queries.js';
import { atomically, MSSQL_STORE_SESSION } from './session.js';
import { CLAIM_HINTS, isPaused } from './shared.js';
import type { MssqlTables } from './tables.js';

/** THROW number of the flow claim when its queue's FlowState row is gone (deleted by hand). */
export const MSSQL_FLOW_ROW_MISSING = 51006;

/** `raw` (a datetime2(7) variable) rounded up to the millisecond, exact at datetime2(3). */
function ceilToMillisecond(raw: string): string {
  return `CASE WHEN DATEPART(nanosecond, ${raw}) % 1000000 = 0 THEN ${raw}
                  ELSE DATEADD(nanosecond, 1000000 - DATEPART(nanosecond, ${raw}) % 1000000, ${raw}) END`;
}

/** The smallest (or largest) of integer expressions, without LEAST and GREATEST (SQL Server 2022 only). */
function smallest(...values: string[]): string {
  return extreme('MIN', values);
}

function largest(...values: string[]): string {
  return extreme('MAX', values);
}

function extreme(fn: 'MIN' | 'MAX', values: string[]): string {
  return `(SELECT ${fn}(v) FROM (VALUES ${values.map((value) => `(${value})`).join(', ')}) AS m (v))`;
}

// One step of the walk: the next key with ready jobs after @after (and, once wrapped, at most
// @cursor), one seek on IX_Jobs_KeyReady. READPAST: a key whose only ready rows another session
// holds (a producer's uncommitted insert, a cancel) is not this claim's to wait for.
function nextKey(jobs: string, upToCursor: boolean): string {
  return `SELECT TOP (1) @key = [ConcurrencyKey] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
        WHERE [Queue] = @queue AND [State] = 'ready' AND [ConcurrencyKey] IS NOT NULL AND [ConcurrencyKey] > @after${
          upToCursor ? ' AND [ConcurrencyKey] <= @cursor' : ''
        }
        ORDER BY [ConcurrencyKey];`;
}

// @queue, @limit (jobs: limits refuse groupBatchSize > 1, so a unit is a job), @leaseMs,
// @workerId, @groupBatchSize, @keysAhead (keys looked at beyond the budget: some may be at their
// limit), @keysMax. Answers the claimed jobs (as claim does), then one row: [Paused], and
// [RateFreeInMs] when the queue's rate window is full (how soon its oldest start leaves it).
//
// Jobs without a key (and ordered groups) are one more lane in the turn: all the room when no
// keyed job waits, else one job, as a key gets in a round, plus whatever the keys could not use
// (at their limits, or too few). The cursor moves to the last key served when the budget ran
// out, else past every key looked at (keys at their limit included, so a claim never stays on
// them).
export function flowClaim(t: MssqlTables): string {
  const { jobs, settings, groups, pauses, flowState, flowStarts } = t;
  const windowStart = (perMs: string) => `DATEADD(millisecond, -${perMs}, @at)`;
  return `${MSSQL_STORE_SESSION}${CLAIMED_TABLE}DECLARE @at datetime2(7), @raw datetime2(7), @leaseAt datetime2(3), @paused bit = 0,
  @global int, @perKey int, @rateMax int, @ratePerMs int, @keyRateMax int, @keyRatePerMs int,
  @room int = 0, @recent int, @oldest datetime2(3), @rateFreeInMs int = NULL, @keyedWork bit = 0, @plainWork bit = 0,
  @keyBudget int, @keysToWalk int, @cursor nvarchar(255), @after nvarchar(255), @key nvarchar(255), @walked int = 0,
  @wrapped bit = 0, @rooms int, @per int, @keyed int = 0, @exists bit;
DECLARE @walk TABLE ([Ord] int NOT NULL PRIMARY KEY, [Key] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL, [Room] int NULL);
DECLARE @chosen TABLE ([Id] bigint NOT NULL PRIMARY KEY);
-- The queue's row, made by its first flow claim; a concurrent first one meets the primary key.
IF NOT EXISTS (SELECT 1 FROM ${flowState} WHERE [Queue] = @queue AND [Lane] = N'')
BEGIN
  BEGIN TRY
    INSERT INTO ${flowState} WITH (ROWLOCK) ([Queue], [Lane]) VALUES (@queue, N'');
  END TRY
  BEGIN CATCH
    IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;
  END CATCH;
END;
${atomically(`  SELECT @cursor = [CursorKey] FROM ${flowState} WITH (UPDLOCK, ROWLOCK) WHERE [Queue] = @queue AND [Lane] = N'';
  IF @@ROWCOUNT = 0
    THROW ${MSSQL_FLOW_ROW_MISSING}, N'nestjs-sql-queue: the queue''s FlowState row is missing (deleted by hand?); the next claim makes it again', 1;
  SELECT @global = [GlobalConcurrency], @perKey = [ConcurrencyPerKey], @rateMax = [RateMax], @ratePerMs = [RatePerMs],
         @keyRateMax = [KeyRateMax], @keyRatePerMs = [KeyRatePerMs]
  FROM ${settings} WHERE [Queue] = @queue;
  SET @at = SYSUTCDATETIME();
  IF ${isPaused(pauses, '@queue')} SET @paused = 1;
  IF @paused = 0 SET @room = @limit;
  IF @global IS NOT NULL AND @room > 0
    SET @room = ${smallest('@room', `@global - (SELECT COUNT(*) FROM ${jobs} WHERE [Queue] = @queue AND [State] = 'leased')`)};
  IF @rateMax IS NOT NULL AND @room > 0
  BEGIN
    SELECT @recent = COUNT(*), @oldest = MIN([At]) FROM ${flowStarts}
    WHERE [Queue] = @queue AND [Lane] = N'' AND [At] > ${windowStart('@ratePerMs')};
    IF @recent >= @rateMax
      SET @rateFreeInMs = ${largest('0', 'DATEDIFF(millisecond, @at, DATEADD(millisecond, @ratePerMs, @oldest))')};
    SET @room = ${smallest('@room', '@rateMax - @recent')};
  END;
  -- Below zero when the limits were lowered under running jobs: nothing to take (and TOP refuses a
  -- negative count). Then due delayed jobs without a group become ready first (keyed ones
  -- included), so this claim sees them.
  IF @room < 0 SET @room = 0;
${promoteDueJobs(jobs, '@room', '  ')}
  IF @room > 0
  BEGIN
    IF EXISTS (SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
               WHERE [Queue] = @queue AND [State] = 'ready' AND [ConcurrencyKey] IS NOT NULL)
      SET @keyedWork = 1;
    IF EXISTS (SELECT 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
               WHERE [Queue] = @queue AND [State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL
                 AND [RunAt] <= SYSUTCDATETIME())
       OR EXISTS (SELECT 1 FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
                  WHERE [Queue] = @queue AND ${CLAIMABLE_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME())
       OR EXISTS (SELECT 1 FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
                  WHERE [Queue] = @queue AND ${WAITING_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME())
      SET @plainWork = 1;
  END;
  SET @keyBudget = @room - CASE WHEN @plainWork = 1 THEN 1 ELSE 0 END;
  IF @keyedWork = 1 AND @keyBudget > 0
  BEGIN
    SET @keysToWalk = ${smallest('@keyBudget + @keysAhead', '@keysMax')};
    -- Keys are never empty (validation), so N'' sorts before every one.
    SET @after = ISNULL(@cursor, N'');
    WHILE @walked < @keysToWalk
    BEGIN
      SET @key = NULL;
      IF @wrapped = 0
        ${nextKey(jobs, false)}
      ELSE
        ${nextKey(jobs, true)}
      IF @key IS NOT NULL
      BEGIN
        SET @walked = @walked + 1;
        INSERT INTO @walk ([Ord], [Key]) VALUES (@walked, @key);
        SET @after = @key;
      END
      ELSE IF @wrapped = 0 AND ISNULL(@cursor, N'') <> N''
      BEGIN
        SET @wrapped = 1;
        SET @after = N'';
      END
      ELSE
        BREAK;
    END;
    UPDATE w
    SET [Room] = CASE WHEN b.[BlockedUntil] > @at THEN 0 ELSE ${largest(
      '0',
      smallest(
        '@keyBudget',
        `CASE WHEN @perKey IS NULL THEN @keyBudget
                 ELSE @perKey - (SELECT COUNT(*) FROM ${jobs} AS l
                                 WHERE l.[Queue] = @queue AND l.[State] = 'leased' AND l.[ConcurrencyKey] IS NOT NULL
                                   AND l.[ConcurrencyKey] = w.[Key]) END`,
        `CASE WHEN @keyRateMax IS NULL THEN @keyBudget
                 ELSE @keyRateMax - (SELECT COUNT(*) FROM ${flowStarts} AS st
                                     WHERE st.[Queue] = @queue AND st.[Lane] = w.[Key] AND st.[At] > ${windowStart('@keyRatePerMs')}) END`,
      ),
    )} END
    FROM @walk AS w
    OUTER APPLY (SELECT f.[BlockedUntil] FROM ${flowState} AS f WHERE f.[Queue] = @queue AND f.[Lane] = w.[Key]) AS b;
    SET @rooms = (SELECT COUNT(*) FROM @walk WHERE [Room] > 0);
    IF @rooms > 0 AND ${isPaused(pauses, '@queue')} SET @rooms = 0;
    IF @rooms > 0
    BEGIN
      SET @per = (@keyBudget + @rooms - 1) / @rooms;
      INSERT INTO @chosen ([Id])
      SELECT TOP (@keyBudget) p.[Id]
      FROM @walk AS w
      CROSS APPLY (
        SELECT TOP (CASE WHEN w.[Room] < @per THEN w.[Room] ELSE @per END) j.[Id],
               ROW_NUMBER() OVER (ORDER BY j.[Priority] DESC, j.[RunAt], j.[Id]) AS [Rn]
        FROM ${jobs} AS j WITH (${CLAIM_HINTS})
        WHERE j.[Queue] = @queue AND j.[State] = 'ready' AND j.[ConcurrencyKey] IS NOT NULL AND j.[ConcurrencyKey] = w.[Key]
          AND j.[RunAt] <= SYSUTCDATETIME()
        ORDER BY j.[Priority] DESC, j.[RunAt], j.[Id]
      ) AS p
      WHERE w.[Room] > 0
      ORDER BY p.[Rn], w.[Ord];
      SET @raw = SYSUTCDATETIME();
      SET @leaseAt = ${ceilToMillisecond('@raw')};
      UPDATE j
${leaseAndAnswer({ leaseAt: '@leaseAt' }, { token: 'NEWID()', attempts: 'j.[Attempts]', unit: 'inserted.[Priority], inserted.[RunAt], inserted.[Id]' }, '      ')}
      FROM ${jobs} AS j WITH (ROWLOCK)
      INNER JOIN @chosen AS c ON c.[Id] = j.[Id]
      WHERE j.[State] = 'ready';
      SET @keyed = @@ROWCOUNT;
      IF @keyRateMax IS NOT NULL AND @keyed > 0
      BEGIN
        DELETE st FROM ${flowStarts} AS st WITH (ROWLOCK)
        WHERE st.[Queue] = @queue AND st.[At] <= ${windowStart('@keyRatePerMs')}
          AND st.[Lane] IN (SELECT c.[ConcurrencyKey] FROM @claimed AS c WHERE c.[ConcurrencyKey] IS NOT NULL);
        INSERT INTO ${flowStarts} WITH (ROWLOCK) ([Queue], [Lane], [At])
        SELECT @queue, c.[ConcurrencyKey], c.[ClaimedAt] FROM @claimed AS c WHERE c.[ConcurrencyKey] IS NOT NULL;
      END;
    END;
    UPDATE ${flowState} WITH (ROWLOCK)
    SET [CursorKey] = COALESCE(
          (SELECT w.[Key] FROM @walk AS w
           WHERE w.[Ord] = CASE WHEN @keyed >= @keyBudget
                                THEN (SELECT MAX(s.[Ord]) FROM @walk AS s
                                      WHERE s.[Key] IN (SELECT c.[ConcurrencyKey] FROM @claimed AS c WHERE c.[ConcurrencyKey] IS NOT NULL))
                                ELSE (SELECT MAX(a.[Ord]) FROM @walk AS a) END),
          [CursorKey]),
        [UpdatedAt] = SYSUTCDATETIME()
    WHERE [Queue] = @queue AND [Lane] = N'';
  END;
  IF @plainWork = 1 AND @room - @keyed > 0
  BEGIN
    SET @limit = @room - @keyed;
    SET @raw = SYSUTCDATETIME();
    SET @leaseAt = ${ceilToMillisecond('@raw')};
${claimUnits(t, { leaseAt: '@leaseAt' }, (body) => body)
  .split('\n')
  .map((line) => `    ${line}`)
  .join('\n')}
  END;
  IF @rateMax IS NOT NULL AND EXISTS (SELECT 1 FROM @claimed)
  BEGIN
    DELETE FROM ${flowStarts} WITH (ROWLOCK)
    WHERE [Queue] = @queue AND [Lane] = N'' AND [At] <= ${windowStart('@ratePerMs')};
    INSERT INTO ${flowStarts} WITH (ROWLOCK) ([Queue], [Lane], [At]) SELECT @queue, N'', [ClaimedAt] FROM @claimed;
  END;`)}
${CLAIMED_ROWS}
SELECT @paused AS [Paused], @rateFreeInMs AS [RateFreeInMs];`;
}

// @queue, @top (keys to list). A monitoring read: the queue's recorded limits, its leased jobs,
// the starts in its window, and per key its leased (IX_Jobs_KeyLeased) and waiting
// (IX_Jobs_KeyReady) jobs, the busiest @top listed (JSON text).
export function flowUsage(t: MssqlTables): string {
  const { jobs, settings, flowStarts } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @perKey TABLE (
  [Key] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY, [Running] int NOT NULL, [Waiting] int NOT NULL);
INSERT INTO @perKey ([Key], [Running], [Waiting])
SELECT k.[Key], SUM(k.[Running]), SUM(k.[Waiting])
FROM (SELECT [ConcurrencyKey] AS [Key], 1 AS [Running], 0 AS [Waiting] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
      WHERE [Queue] = @queue AND [State] = 'leased' AND [ConcurrencyKey] IS NOT NULL
      UNION ALL
      SELECT [ConcurrencyKey], 0, 1 FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
      WHERE [Queue] = @queue AND [State] = 'ready' AND [ConcurrencyKey] IS NOT NULL) AS k
GROUP BY k.[Key];
SELECT s.[GlobalConcurrency], s.[ConcurrencyPerKey], s.[RateMax], s.[RatePerMs], s.[KeyRateMax], s.[KeyRatePerMs],
  (SELECT COUNT(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'leased') AS [Running],
  CASE WHEN s.[RateMax] IS NOT NULL THEN
    (SELECT COUNT(*) FROM ${flowStarts} AS st WITH (READPAST, READCOMMITTEDLOCK)
     WHERE st.[Queue] = @queue AND st.[Lane] = N'' AND st.[At] > DATEADD(millisecond, -s.[RatePerMs], SYSUTCDATETIME())) END
    AS [WindowStarts],
  CASE WHEN s.[ConcurrencyPerKey] IS NOT NULL THEN
    (SELECT COUNT(*) FROM @perKey WHERE [Waiting] > 0 AND [Running] >= s.[ConcurrencyPerKey]) END AS [KeysAtLimit],
  (SELECT TOP (@top) p.[Key] AS [key], p.[Running] AS [running], p.[Waiting] AS [waiting]
   FROM @perKey AS p ORDER BY p.[Running] DESC, p.[Waiting] DESC, p.[Key]
   FOR JSON PATH, INCLUDE_NULL_VALUES) AS [Keys]
FROM (VALUES (1)) AS one (x)
LEFT JOIN ${settings} AS s ON s.[Queue] = @queue;`;
}

// @batch. Retention of flow rows nothing reads any more: starts older than their lane's window
// (plus a minute), and postponed keys' rows whose wait is over. Rows a flow claim holds are
// passed over (READPAST), not waited for; the queue rows (Lane N'') stay.
export function cleanupFlowState(t: MssqlTables): string {
  const { settings, flowState, flowStarts } = t;
  return `${MSSQL_STORE_SESSION}WITH old AS (
  SELECT TOP (@batch) *
  FROM ${flowStarts} AS st WITH (${CLAIM_HINTS})
  WHERE st.[At] < DATEADD(minute, -1, DATEADD(millisecond, -ISNULL(
          (SELECT CASE WHEN st.[Lane] = N'' THEN s.[RatePerMs] ELSE s.[KeyRatePerMs] END FROM ${settings} AS s WHERE s.[Queue] = st.[Queue]),
          0), SYSUTCDATETIME()))
)
DELETE FROM old;
WITH waited AS (
  SELECT TOP (@batch) *
  FROM ${flowState} AS f WITH (${CLAIM_HINTS})
  WHERE f.[Lane] <> N'' AND (f.[BlockedUntil] IS NULL OR f.[BlockedUntil] < SYSUTCDATETIME())
)
DELETE FROM waited;`;
}
