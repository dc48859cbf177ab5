// The scale recommendation's inputs (core/scaling), and the procedure that applies its rule in
// the database for KEDA's mssql scaler.
import { MAX_MEASURED_RUN_MS, SCALE_WINDOW_MINUTES } from '../../../core/scaling/index.js';
import { quoteMssqlIdentifier } from '../mssql.identifiers.js';
import { minuteStart } from './health.queries.js';
import { MSSQL_STORE_SESSION } from './session.js';
import { isPaused, READY_KEYED, READY_UNKEYED } from './shared.js';
import type { MssqlTables } from './tables.js';

const SKIP_LOCKED = 'WITH (READPAST, READCOMMITTEDLOCK)';

/** THROW number of DesiredReaders' refusals (a bad argument; the message says which). */
export const MSSQL_SCALE_REFUSED = 51011;

/**
 * Sets @claimable, @running, @completed, @windowMs, @paused and the queue's limits for @Queue
 * (ScaleInputs), as PostgreSQL's scaleInputs does: each count a seek on the filtered index its
 * claim reads (IX_Jobs_Claim, IX_Jobs_KeyReady, IX_Jobs_Delayed, IX_Jobs_KeyLeased,
 * IX_Groups_Claimable, IX_Groups_Waiting), the completions of the five whole minutes before the
 * current one (PK_Throughput's range). READPAST, READCOMMITTEDLOCK, as every monitoring read: it
 * never queues behind a producer's or claimer's open transaction (rows locked at that instant are
 * not counted), under READ_COMMITTED_SNAPSHOT or not. Needs READ COMMITTED (READPAST's rule).
 */
function scaleInputsBody(t: MssqlTables): string {
  const { jobs, groups, settings, throughput, pauses, flowState } = t;
  return `DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @claimable bigint, @running bigint, @completed bigint, @busyMs bigint, @windowMs bigint = ${SCALE_WINDOW_MINUTES * 60_000}, @paused bit,
  @globalConcurrency int, @concurrencyPerKey int, @rateMax int, @ratePerMs int;
SELECT @globalConcurrency = [GlobalConcurrency], @concurrencyPerKey = [ConcurrencyPerKey], @rateMax = [RateMax], @ratePerMs = [RatePerMs]
FROM ${settings} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @Queue;
SET @claimable =
  (SELECT COUNT_BIG(*) FROM ${jobs} ${SKIP_LOCKED} WHERE [Queue] = @Queue AND ${READY_UNKEYED} AND [RunAt] <= @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} ${SKIP_LOCKED}
     WHERE [Queue] = @Queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL AND [RunAt] <= @now)
  + ISNULL((SELECT SUM(CASE WHEN @concurrencyPerKey IS NULL THEN k.[N]
                            WHEN @concurrencyPerKey - ISNULL(l.[N], 0) <= 0 THEN 0
                            WHEN k.[N] < @concurrencyPerKey - ISNULL(l.[N], 0) THEN k.[N]
                            ELSE @concurrencyPerKey - ISNULL(l.[N], 0) END)
            FROM (SELECT d.[ConcurrencyKey], COUNT_BIG(*) AS [N]
                  FROM (SELECT [ConcurrencyKey] FROM ${jobs} ${SKIP_LOCKED} WHERE [Queue] = @Queue AND ${READY_KEYED} AND [RunAt] <= @now
                        UNION ALL
                        SELECT [ConcurrencyKey] FROM ${jobs} ${SKIP_LOCKED}
                        WHERE [Queue] = @Queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NOT NULL AND [RunAt] <= @now) AS d
                  GROUP BY d.[ConcurrencyKey]) AS k
            LEFT JOIN (SELECT [ConcurrencyKey], COUNT_BIG(*) AS [N] FROM ${jobs} ${SKIP_LOCKED}
                       WHERE [Queue] = @Queue AND [State] = 'leased' AND [ConcurrencyKey] IS NOT NULL GROUP BY [ConcurrencyKey]) AS l
              ON l.[ConcurrencyKey] = k.[ConcurrencyKey]
            -- A key its rate limit holds back (FlowState's lane of the key, blocked until later) takes none now.
            WHERE NOT EXISTS (SELECT 1 FROM ${flowState} AS f ${SKIP_LOCKED}
                              WHERE f.[Queue] = @Queue AND f.[Lane] = k.[ConcurrencyKey] AND f.[BlockedUntil] > @now)), 0)
  + (SELECT COUNT_BIG(*) FROM ${groups} ${SKIP_LOCKED}
     WHERE [Queue] = @Queue AND [HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 0)
  + (SELECT COUNT_BIG(*) FROM ${groups} ${SKIP_LOCKED}
     WHERE [Queue] = @Queue AND [HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 1 AND [HeadReadyAt] <= @now);
SET @running = (SELECT COUNT_BIG(*) FROM ${jobs} ${SKIP_LOCKED} WHERE [Queue] = @Queue AND [State] = 'leased');
SELECT @completed = ISNULL(SUM([Completed]), 0), @busyMs = ISNULL(SUM([BusyMs]), 0) FROM ${throughput} ${SKIP_LOCKED}
WHERE [Minute] >= ${minuteStart('@now', ` - ${SCALE_WINDOW_MINUTES}`)} AND [Minute] < ${minuteStart('@now')} AND [Queue] = @Queue;
SET @paused = CASE WHEN ${isPaused(pauses, '@Queue')} THEN 1 ELSE 0 END;
`;
}

// @Queue. The store's reading of ScaleInputs (the Prometheus gauge and SqlQueueMetrics).
export function scaleInputs(t: MssqlTables): string {
  return `${MSSQL_STORE_SESSION}${scaleInputsBody(t)}SELECT @claimable AS [Claimable], @running AS [Running], @completed AS [CompletedInWindow],
  @busyMs AS [BusyMsInWindow], @windowMs AS [WindowMs], @paused AS [Paused], @globalConcurrency AS [GlobalConcurrency], @rateMax AS [RateMax],
  @ratePerMs AS [RatePerMs];`;
}

/** The procedure's name, as its GRANT names it. */
export function mssqlDesiredReadersName(schema: string): string {
  return `${quoteMssqlIdentifier(schema)}.[DesiredReaders]`;
}

/**
 * `EXEC [<schema>].[DesiredReaders] @Queue = N'…'`: one row, [DesiredReaders], core/scaling's
 * desiredReaders on the same inputs in bigint arithmetic (⌈a / b⌉ as (a + b - 1) / b), for KEDA's
 * mssql scaler, whose query may be any statement returning one value (targetValue: the queue's
 * maxReaders gives pods). A procedure, not a function: a function may not SET the isolation level
 * READPAST needs. WITH EXECUTE AS OWNER: a scaler's login needs EXECUTE on it only.
 */
export function mssqlDesiredReadersProcedure(t: MssqlTables): string {
  const refuse = (parameter: string, min: number) => `IF ${parameter} IS NULL OR ${parameter} < ${min}
BEGIN
  SET @message = CONCAT(N'DesiredReaders: ${parameter} must be an integer from ${min} up, got ', ISNULL(CAST(${parameter} AS nvarchar(20)), N'null'));
  THROW ${MSSQL_SCALE_REFUSED}, @message, 1;
END;
`;
  return `CREATE PROCEDURE ${mssqlDesiredReadersName(t.schema)}
  @Queue nvarchar(128),
  @TargetDrainMs int = 60000,
  @DefaultRunMs int = 1000
WITH EXECUTE AS OWNER
AS
BEGIN
SET NOCOUNT ON;
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
DECLARE @message nvarchar(2048);
${refuse('@TargetDrainMs', 1000)}${refuse('@DefaultRunMs', 1)}${scaleInputsBody(t)}DECLARE @runMs bigint = @DefaultRunMs, @readers bigint, @cap bigint;
IF @completed > 0 AND @busyMs > 0
BEGIN
  SET @runMs = (@busyMs + @completed - 1) / @completed;
  IF @runMs > ${MAX_MEASURED_RUN_MS} SET @runMs = ${MAX_MEASURED_RUN_MS};
END;
IF @paused = 1
  SET @readers = @running;
ELSE IF @claimable = 0 AND @running = 0
  SET @readers = 0;
ELSE
BEGIN
  SET @readers = (@busyMs + @windowMs - 1) / @windowMs + (@claimable * @runMs + @TargetDrainMs - 1) / @TargetDrainMs;
  IF @readers < @running SET @readers = @running;
  IF @globalConcurrency IS NOT NULL AND @readers > @globalConcurrency SET @readers = @globalConcurrency;
  IF @rateMax IS NOT NULL AND @ratePerMs > 0
  BEGIN
    SET @cap = (CAST(@rateMax AS bigint) * @runMs + @ratePerMs - 1) / @ratePerMs;
    IF @readers > @cap SET @readers = @cap;
  END;
  IF @claimable > 0 AND @readers < 1 SET @readers = 1;
END;
IF @readers > 2147483647 SET @readers = 2147483647;
SELECT CAST(@readers AS int) AS [DesiredReaders];
END;`;
}
