// Recurring jobs: due schedules, the fire's lock and advance, upsert, get, list, delete, pause.
import { atomically, MSSQL_STORE_SESSION, MSSQL_STORE_TRANSACTION_SESSION } from './session.js';
import { CLAIM_HINTS, takeKeyLock } from './shared.js';
import type { MssqlTables } from './tables.js';

// The scheduler's idle poll, one autocommit statement: the database's now, and the ms until
// the earliest unpaused schedule is due (<= 0: due; null: none). MIN reads one end of
// IX_Schedules_Due (its filter named literally). Both times are datetime2(3), so the
// difference is exact in ms. READPAST: a row another instance is firing, or that an
// application's transaction holds, never makes the poll wait (the fire skips it too), and is
// read again at the next poll.
export function scheduleDueIn(t: MssqlTables): string {
  const { schedules } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT @now AS [Now], DATEDIFF_BIG(millisecond, @now, MIN([NextRunAt])) AS [DueInMs]
FROM ${schedules} WITH (READPAST, READCOMMITTEDLOCK)
WHERE ${UNPAUSED_SCHEDULE};`;
}

// @limit. In fireDueSchedules' transaction: the due schedules no other session holds,
// earliest first (the key order of IX_Schedules_Due, so the seek stops after TOP rows), with
// the claim hints (CLAIM_HINTS: no ROWLOCK beside READCOMMITTEDLOCK, see there). UPDLOCK
// keeps each row until the transaction ends ("update locks are to be taken and held until
// the transaction completes", Table hints), so two instances never hold one schedule: the
// second reads past it, and once the first commits, the row's NextRunAt is after that
// round's now. @now is the round's time, handed to plan and written by scheduleAdvance.
export function scheduleLockDue(t: MssqlTables): string {
  const { schedules } = t;
  return `${MSSQL_STORE_TRANSACTION_SESSION}DECLARE @now datetime2(3) = SYSUTCDATETIME();
SELECT TOP (@limit) ${SCHEDULE_COLUMNS}, @now AS [Now]
FROM ${schedules} WITH (${CLAIM_HINTS})
WHERE ${UNPAUSED_SCHEDULE} AND [NextRunAt] <= @now
ORDER BY [NextRunAt], [Id];`;
}

// @items ScheduleAdvanceList (the schedules scheduleLockDue locked), @now (its round's time).
// A firing that enqueued no job (every missed tick skipped) moves NextRunAt only: the last
// run and its tick are those of the last job enqueued. FORCESEEK: one seek per item, so the
// statement touches no row but those this transaction already holds.
export function scheduleAdvance(t: MssqlTables): string {
  const { schedules } = t;
  return `${MSSQL_STORE_TRANSACTION_SESSION}UPDATE s
SET [NextRunAt] = a.[NextRunAt],
    [LastRunAt] = CASE WHEN a.[Fired] = 1 THEN @now ELSE s.[LastRunAt] END,
    [LastTick] = CASE WHEN a.[Fired] = 1 THEN a.[LastTick] ELSE s.[LastTick] END,
    [UpdatedAt] = @now
FROM ${schedules} AS s WITH (ROWLOCK, FORCESEEK)
INNER JOIN @items AS a ON s.[Id] = a.[Id];`;
}

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
export function scheduleUpsert(t: MssqlTables): string {
  const { schedules, schema } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @resource nvarchar(255), @lock int, @refused nvarchar(2048), @seq int = 1, @lockCount int;
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
    WHERE s.[Source] = @prune AND NOT EXISTS (SELECT 1 FROM @items AS i WHERE i.[Id] = s.[Id]);`)}`;
}

// @id
export function scheduleGet(t: MssqlTables): string {
  const { schedules } = t;
  return `${MSSQL_STORE_SESSION}SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} WHERE [Id] = @id;`;
}

export function scheduleList(t: MssqlTables): string {
  const { schedules } = t;
  return `${MSSQL_STORE_SESSION}SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} ORDER BY [Id];`;
}

// @id. Whether it existed (a fire holding the row is waited for; the schedule is then gone).
export function scheduleDelete(t: MssqlTables): string {
  const { schedules } = t;
  return `${MSSQL_STORE_SESSION}DELETE FROM ${schedules} WITH (ROWLOCK) WHERE [Id] = @id;
SELECT CAST(CASE WHEN @@ROWCOUNT > 0 THEN 1 ELSE 0 END AS bit) AS [Existed];`;
}

// @id, @paused, @nextRunAt (for a resume). Only a paused schedule that resumes takes
// @nextRunAt (it does not catch up its paused period); pausing, or resuming one that runs,
// keeps the time it has, so a tick due right now is not skipped.
export function schedulePause(t: MssqlTables): string {
  const { schedules } = t;
  return `${MSSQL_STORE_SESSION}UPDATE ${schedules} WITH (ROWLOCK)
SET [NextRunAt] = CASE WHEN [Paused] = 1 AND @paused = 0 THEN @nextRunAt ELSE [NextRunAt] END,
    [Paused] = @paused, [UpdatedAt] = SYSUTCDATETIME()
WHERE [Id] = @id;
SELECT CAST(CASE WHEN @@ROWCOUNT > 0 THEN 1 ELSE 0 END AS bit) AS [Existed];`;
}

/**
 * The application-lock resource of one schedule id, as keyLockResource with its own prefix:
 * every upsert holds the locks of its ids (scheduleUpsert).
 */
function scheduleLockResource(schema: string, id: string): string {
  return `N'nestjs-sql-queue:schedule:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'${schema.toLowerCase()}/', ${id})), 2)`;
}

/** The filter of IX_Schedules_Due, literally (see CLAIMABLE_GROUP): schedules that will fire. */
export const UNPAUSED_SCHEDULE = '[Paused] = 0 AND [NextRunAt] IS NOT NULL';

const SCHEDULE_COLUMNS = `[Id], [Queue], [Cron], [Timezone], [Payload], [Options], [CatchUp], [Paused], [Source], [NextRunAt],
  [LastRunAt], [LastTick], [CreatedAt], [UpdatedAt]`;
