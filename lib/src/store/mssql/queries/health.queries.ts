// Measurements: per-queue stats, the bounded health reading, ping, throughput buckets.
import { UNFINISHED_GROUPED } from './groups.queries.js';
import { atomically, MSSQL_STORE_SESSION } from './session.js';
import { isPaused, READY_KEYED, READY_UNKEYED } from './shared.js';
import type { MssqlTables } from './tables.js';

// Each figure reads one filtered index that covers it (Attempts is included in the ready
// index since migration 3, and in the delayed and group indexes), so the cost follows live
// rows, not history. A delayed job that is due but not promoted yet (no claim since) counts
// as ready: it is waiting. Ready rows not due yet only exist if written before version 4
// (which moved them). Grouped jobs waiting behind their group's head (IX_Jobs_Group) count
// as ready or delayed by their run time, as the ones a claim can take do.
// READPAST: a monitoring read must never queue behind a producer's open transaction (as
// PostgreSQL's MVCC reads never do); rows locked at that instant are simply not counted.
export function stats(t: MssqlTables): string {
  const { jobs, groups, pauses } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @groupedReady bigint, @groupedDelayed bigint, @groupedRetrying bigint, @groupedOldest datetime2(3);
SELECT @groupedReady = COUNT_BIG(CASE WHEN [State] <> 'leased' AND [RunAt] <= @now THEN 1 END),
       @groupedDelayed = COUNT_BIG(CASE WHEN [State] <> 'leased' AND [RunAt] > @now THEN 1 END),
       @groupedRetrying = COUNT_BIG(CASE WHEN [State] <> 'leased' AND [Attempts] > 0 THEN 1 END),
       @groupedOldest = MIN(CASE WHEN [State] <> 'leased' AND [RunAt] <= @now THEN [RunAt] END)
FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
WHERE [Queue] = @queue AND ${UNFINISHED_GROUPED};
SELECT
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${READY_UNKEYED} AND [RunAt] <= @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${READY_KEYED} AND [RunAt] <= @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= @now)
  + @groupedReady AS [Ready],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] > @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${READY_UNKEYED} AND [RunAt] > @now)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${READY_KEYED} AND [RunAt] > @now)
  + @groupedDelayed AS [Delayed],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'leased') AS [Leased],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'leased' AND [LeaseUntil] < @now) AS [ExpiredLeases],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'dead') AS [Dead],
  (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${READY_UNKEYED} AND [Attempts] > 0)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${READY_KEYED} AND [Attempts] > 0)
  + (SELECT COUNT_BIG(*) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [Attempts] > 0)
  + @groupedRetrying AS [Retrying],
  (SELECT COUNT_BIG(*) FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [Blocked] = 1) AS [BlockedGroups],
  CAST(CASE WHEN ${isPaused(pauses, '@queue')} THEN 1 ELSE 0 END AS bit) AS [Paused],
  (SELECT DATEDIFF_BIG(millisecond, MIN(w.[RunAt]), @now) FROM (
     SELECT MIN([RunAt]) AS [RunAt] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
     WHERE [Queue] = @queue AND ${READY_UNKEYED} AND [RunAt] <= @now
     UNION ALL
     SELECT MIN([RunAt]) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
     WHERE [Queue] = @queue AND ${READY_KEYED} AND [RunAt] <= @now
     UNION ALL
     SELECT MIN([RunAt]) FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
     WHERE [Queue] = @queue AND [State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= @now
     UNION ALL
     SELECT @groupedOldest) AS w) AS [OldestReadyAgeMs];`;
}

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
export function recordThroughput(t: MssqlTables): string {
  const { throughput } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @minute datetime2(3) = ${minuteStart('@now')};
DECLARE @queue nvarchar(128) = (SELECT MIN([Queue]) FROM @counts), @completed bigint, @failed bigint, @dead bigint,
  @busyMs bigint;
${atomically(`  WHILE @queue IS NOT NULL
  BEGIN
    SELECT @completed = [Completed], @failed = [Failed], @dead = [Dead], @busyMs = [BusyMs] FROM @counts WHERE [Queue] = @queue;
    UPDATE ${throughput} WITH (UPDLOCK, HOLDLOCK)
    SET [Completed] = [Completed] + @completed, [Failed] = [Failed] + @failed, [Dead] = [Dead] + @dead,
        [BusyMs] = [BusyMs] + @busyMs
    WHERE [Minute] = @minute AND [Queue] = @queue;
    IF @@ROWCOUNT = 0
      INSERT INTO ${throughput} ([Minute], [Queue], [Completed], [Failed], [Dead], [BusyMs])
      VALUES (@minute, @queue, @completed, @failed, @dead, @busyMs);
    SET @queue = (SELECT MIN([Queue]) FROM @counts WHERE [Queue] > @queue);
  END;`)}`;
}

// @minutes (1..1440, checked by the store). The database's now, then the buckets of the last
// @minutes minutes, the current one included, oldest first: one range of PK_Throughput.
export function readThroughput(t: MssqlTables): string {
  const { throughput } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @since datetime2(3) = ${minuteStart('@now', ' - @minutes + 1')};
SELECT @now AS [Now];
SELECT [Minute], [Queue], [Completed], [Failed], [Dead]
FROM ${throughput}
WHERE [Minute] >= @since
ORDER BY [Minute], [Queue];`;
}

export function ping(_t: MssqlTables): string {
  return 'SELECT 1 AS [Ok];';
}

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
export function queueHealth(t: MssqlTables): string {
  const { jobs, attempts, groups, pauses } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
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
FROM (SELECT [Queue], [RunAt], [Attempts] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE ${READY_UNKEYED}
      UNION ALL
      SELECT [Queue], [RunAt], [Attempts] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE ${READY_KEYED}
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
       ISNULL(DATEDIFF_BIG(millisecond, r.[OldestDue], @now), 0) AS [OldestReadyAgeMs],
       CAST(CASE WHEN ${isPaused(pauses, 'q.[Queue]')} THEN 1 ELSE 0 END AS bit) AS [Paused]
FROM (SELECT [Queue] FROM @ready UNION SELECT [Queue] FROM @leased UNION SELECT [Queue] FROM @dead
      UNION SELECT [Queue] FROM @failures UNION SELECT [Queue] FROM @blocked
      UNION SELECT [Queue] FROM ${pauses} WITH (READPAST, READCOMMITTEDLOCK)) AS q
LEFT JOIN @ready AS r ON r.[Queue] = q.[Queue]
LEFT JOIN @leased AS l ON l.[Queue] = q.[Queue]
LEFT JOIN @dead AS d ON d.[Queue] = q.[Queue]
LEFT JOIN @blocked AS b ON b.[Queue] = q.[Queue]
LEFT JOIN @failures AS f ON f.[Queue] = q.[Queue]
ORDER BY q.[Queue];`;
}

/**
 * The start of the minute `at` (a datetime2(3)) is in, moved by `shift` whole minutes: DATEDIFF
 * counts the minute boundaries crossed since a datetime2 anchor on a boundary (an int until the
 * year 6000), DATEADD keeps the anchor's type. (DATETRUNC would need SQL Server 2022.)
 */
export function minuteStart(at: string, shift = ''): string {
  const anchor = 'DATETIME2FROMPARTS(2000, 1, 1, 0, 0, 0, 0, 3)';
  return `DATEADD(minute, DATEDIFF(minute, ${anchor}, ${at})${shift}, ${anchor})`;
}
