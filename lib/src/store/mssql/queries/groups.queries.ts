// Ordered groups: the fragments that keep the Groups table in step with the jobs (activation,
// settling, heads), blocked-group listings and the repair sweep.
import { atomically, MSSQL_STORE_SESSION } from './session.js';
import { takeKeyLock } from './shared.js';
import type { MssqlTables } from './tables.js';

// @queue, @afterKey (null: from the first), @limit. Blocked groups by key (IX_Groups_Blocked),
// each with the dead job that blocks it, its last error and when it died.
export function listBlockedGroups(t: MssqlTables): string {
  const { jobs, groups } = t;
  return `${MSSQL_STORE_SESSION}SELECT TOP (@limit) g.[GroupKey], CAST(g.[HeadId] AS varchar(20)) AS [JobId],
  j.[LastError], j.[FinishedAt]
FROM ${groups} AS g
LEFT JOIN ${jobs} AS j ON j.[Id] = g.[HeadId]
WHERE g.[Queue] = @queue AND g.[Blocked] = 1 AND g.[GroupKey] > ISNULL(@afterKey, N'')
ORDER BY g.[GroupKey];`;
}

// @rowQueue, @rowKey (null: from the start), @orphanQueue, @orphanKey (likewise), @limit.
// The repair sweep's first look, taking no lock and waiting for none (see repairGroup for the
// second): up to @limit group rows after the row cursor (rows in use are skipped, and seen
// on a later pass) checked against their jobs, and up to @limit groups with unfinished jobs
// after the orphan cursor (a loose index scan on IX_Jobs_Group, two seeks per group) checked
// for a row. The jobs are read dirty, as the transitions read them. Returns what looks wrong
// (Kind 'row' with the row's version, or 'orphan') and the two cursors to resume from
// (Kind 'rows' and 'orphans'; null keys: start over).
export function findGroupProblems(t: MssqlTables): string {
  const { jobs, groups } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @found TABLE (
  [Kind] varchar(8) NOT NULL, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Version] bigint NULL, [Problem] nvarchar(400) NULL);
DECLARE @page TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL, [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL, [HeadId] bigint NULL,
  [HeldToken] uniqueidentifier NULL, [Blocked] bit NOT NULL, [Version] bigint NOT NULL,
  PRIMARY KEY ([Queue], [GroupKey]));
DECLARE @q nvarchar(128) = @orphanQueue, @k nvarchar(255) = @orphanKey, @nextQueue nvarchar(128), @nextKey nvarchar(255);
DECLARE @walked int = 0, @rowCursorQueue nvarchar(128), @rowCursorKey nvarchar(255);
INSERT INTO @page ([Queue], [GroupKey], [HeadId], [HeldToken], [Blocked], [Version])
SELECT TOP (@limit) p.[Queue], p.[GroupKey], p.[HeadId], p.[HeldToken], p.[Blocked], p.[Version] FROM (
  SELECT a.* FROM (
    SELECT TOP (@limit) [Queue], [GroupKey], [HeadId], [HeldToken], [Blocked], CAST([RowVersion] AS bigint) AS [Version]
    FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] = @rowQueue AND [GroupKey] > @rowKey
    ORDER BY [GroupKey]) AS a
  UNION ALL
  SELECT b.* FROM (
    SELECT TOP (@limit) [Queue], [GroupKey], [HeadId], [HeldToken], [Blocked], CAST([RowVersion] AS bigint) AS [Version]
    FROM ${groups} WITH (READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] > ISNULL(@rowQueue, N'')
    ORDER BY [Queue], [GroupKey]) AS b
) AS p
ORDER BY p.[Queue], p.[GroupKey];
IF (SELECT COUNT(*) FROM @page) >= @limit
  SELECT TOP (1) @rowCursorQueue = [Queue], @rowCursorKey = [GroupKey] FROM @page ORDER BY [Queue] DESC, [GroupKey] DESC;
INSERT INTO @found ([Kind], [Queue], [GroupKey], [Version], [Problem])
SELECT 'row', p.[Queue], p.[GroupKey], p.[Version], x.[Problem]
FROM @page AS p
OUTER APPLY ${firstUnfinished(jobs, 'p.[Queue]', 'p.[GroupKey]', 'u.[Id]')} AS n
CROSS APPLY (SELECT ${groupProblem(jobs, 'p', 'n.[Id]')} AS [Problem]) AS x
WHERE x.[Problem] IS NOT NULL;
WHILE @walked < @limit
BEGIN
  SET @nextQueue = NULL;
  SELECT TOP (1) @nextQueue = [Queue], @nextKey = [GroupKey]
  FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
  WHERE [Queue] = @q AND [GroupKey] > @k AND ${UNFINISHED_GROUPED}
  ORDER BY [GroupKey];
  IF @nextQueue IS NULL
    SELECT TOP (1) @nextQueue = [Queue], @nextKey = [GroupKey]
    FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] > ISNULL(@q, N'') AND ${UNFINISHED_GROUPED}
    ORDER BY [Queue], [GroupKey];
  IF @nextQueue IS NULL BREAK;
  SET @walked = @walked + 1;
  SET @q = @nextQueue;
  SET @k = @nextKey;
  IF NOT EXISTS (SELECT 1 FROM ${groups} WITH (READUNCOMMITTED) WHERE [Queue] = @q AND [GroupKey] = @k)
    INSERT INTO @found ([Kind], [Queue], [GroupKey], [Version], [Problem])
    VALUES ('orphan', @q, @k, NULL, N'unfinished jobs but no group row');
END;
SELECT [Kind], [Queue], [GroupKey], CAST([Version] AS varchar(20)) AS [Version], [Problem] FROM @found
UNION ALL
SELECT 'rows', @rowCursorQueue, @rowCursorKey, NULL, NULL
UNION ALL
SELECT 'orphans', CASE WHEN @walked >= @limit THEN @q END, CASE WHEN @walked >= @limit THEN @k END, NULL, NULL;`;
}

// @queue, @groupKey, @version (bigint; null for a group found without a row). The repair
// sweep's second look at one group findGroupProblems reported, a moment later, in its own
// transaction: a row is fixed only if it is unchanged since (its RowVersion; a transition
// that was under way when it was first read has changed it since) and not in use (UPDLOCK,
// READPAST), and still wrong by the jobs (read dirty, as the transitions read them). The fix
// is the state the transitions would have left: headed by the lowest unfinished job (held by
// its token if that job is leased), neither blocked nor held otherwise; a row with no
// unfinished job is deleted. A missing row is created under the group's lock (not waited
// for: a producer holding it is creating the row). Returns the problem fixed, or null.
// An idle group headed by a job that is gone (a producer's job a transition or a claim read
// uncommitted as the next head, then rolled back) is fixed without a report: the design
// allows it (groupClaim, step 4), and the group's next claim would have fixed it as well.
export function repairGroup(t: MssqlTables): string {
  const { jobs, groups, schema } = t;
  return `${MSSQL_STORE_SESSION}DECLARE @problem nvarchar(400), @expected bit = 0, @seen bit = 0, @headId bigint, @held uniqueidentifier, @blocked bit;
DECLARE @firstId bigint, @firstAt datetime2(3), @firstPriority int, @firstState varchar(8), @firstToken uniqueidentifier;
DECLARE @lock int, @resource nvarchar(255);
${atomically(`  IF @version IS NOT NULL
    SELECT @seen = 1, @headId = [HeadId], @held = [HeldToken], @blocked = [Blocked]
    FROM ${groups} WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK)
    WHERE [Queue] = @queue AND [GroupKey] = @groupKey AND CAST([RowVersion] AS bigint) = @version;
  SELECT TOP (1) @firstId = [Id], @firstAt = [RunAt], @firstPriority = [Priority], @firstState = [State], @firstToken = [ClaimToken]
  FROM ${jobs} WITH (READUNCOMMITTED)
  WHERE [Queue] = @queue AND [GroupKey] = @groupKey AND ${UNFINISHED_GROUPED}
  ORDER BY [Id];
  IF @seen = 1
  BEGIN
    SELECT @problem = ${groupProblem(jobs, null, '@firstId')};
    IF @problem IS NOT NULL AND @held IS NULL AND @blocked = 0 AND @headId IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM ${jobs} WITH (READUNCOMMITTED) WHERE [Id] = @headId)
      SET @expected = 1;
    IF @problem IS NOT NULL AND @firstId IS NULL
      DELETE FROM ${groups} WITH (ROWLOCK) WHERE [Queue] = @queue AND [GroupKey] = @groupKey;
    ELSE IF @problem IS NOT NULL
      UPDATE ${groups} WITH (ROWLOCK)
      SET [HeldToken] = CASE WHEN @firstState = 'leased' THEN @firstToken END, [Blocked] = 0, [HeadId] = @firstId,
          [HeadReadyAt] = @firstAt, [HeadPriority] = @firstPriority, [Waiting] = ${waitingFor('@firstAt')},
          [UpdatedAt] = SYSUTCDATETIME()
      WHERE [Queue] = @queue AND [GroupKey] = @groupKey;
  END
  ELSE IF @version IS NULL AND @firstId IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM ${groups} WITH (READUNCOMMITTED) WHERE [Queue] = @queue AND [GroupKey] = @groupKey)
  BEGIN
    SET @resource = ${groupLockResource(schema, '@queue', '@groupKey')};
    EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction', @LockTimeout = 0;
    IF @lock >= 0 AND NOT EXISTS (SELECT 1 FROM ${groups} WITH (READCOMMITTEDLOCK) WHERE [Queue] = @queue AND [GroupKey] = @groupKey)
    BEGIN
      INSERT INTO ${groups} WITH (ROWLOCK) ([Queue], [GroupKey], [HeadId], [HeadReadyAt], [HeadPriority], [Waiting], [HeldToken])
      VALUES (@queue, @groupKey, @firstId, @firstAt, @firstPriority, ${waitingFor('@firstAt')},
              CASE WHEN @firstState = 'leased' THEN @firstToken END);
      SET @problem = CONCAT(N'unfinished jobs but no group row; created it with head ', @firstId);
    END;
  END;`)}
SELECT CASE WHEN @expected = 0 THEN @problem END AS [Problem];`;
}

/**
 * The application-lock resource of one ordered group, as keyLockResource with its own prefix.
 * Every session that inserts a group row holds it first (producers, retryDead, the repair
 * sweep), so two of them never race to create one row: the loser of such a race would get
 * error 2627, which dooms the transaction it runs in (XACT_ABORT, or the caller's), so it could
 * not be retried inside the statement. Producers of groups whose row exists never take it.
 */
export function groupLockResource(schema: string, queue: string, key: string): string {
  return `N'nestjs-sql-queue:group:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'${schema.toLowerCase()}/', ${queue}, N'/', ${key})), 2)`;
}

/** Declarations for activateGroups: its input (@heads, one row per group) and its lock list. */
export const GROUP_HEADS = `DECLARE @heads TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Id] bigint NOT NULL, [RunAt] datetime2(3) NOT NULL, [Priority] int NOT NULL, [Found] bit NOT NULL DEFAULT (0),
  PRIMARY KEY ([Queue], [GroupKey]));
DECLARE @groupLocks TABLE ([Seq] int NOT NULL PRIMARY KEY, [Resource] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL);
DECLARE @groupSeq int = 1, @groupLockCount int;
`;

/**
 * A producer's side of the idle → active edge (research A.2, "SQL Server"), in the transaction
 * that inserted the jobs and after the insert: @heads holds, per group, the lowest new job.
 * - A group with no row gets one headed by that job, under the group's application lock
 *   (groupLockResource), taken in resource order like the key locks.
 * - An existing row is headed by the job when the group is idle (no head, not held, not
 *   blocked) or headed by a later job (an earlier-numbered job committing late). A held group is
 *   left alone: its holder moves the head when it releases it, and sees this job then (its read
 *   of the next head is a dirty one, which sees uncommitted jobs), because it locks the row
 *   before that read and this statement reads the row after the insert.
 * Every read of Groups here is a locking read (READCOMMITTEDLOCK): it waits for a transition
 * that is emptying the group right now and reads what that committed. Under
 * READ_COMMITTED_SNAPSHOT a plain read would see the version before, and with optimized
 * locking an UPDATE qualifies rows on their last committed version without waiting; "to force
 * blocking between two queries when optimized locking is enabled, use the READCOMMITTEDLOCK
 * query hint" (https://learn.microsoft.com/sql/relational-databases/performance/optimized-locking).
 * The wait that matters is the existence check's: it runs after the insert, so a transition
 * that locked the row before it is waited for, and one that locks it after it reads the job
 * (dirty). Once a job is in, no transition deletes its group's row (each deletes only when its
 * dirty read finds no unfinished job), so what the existence check found stays. The UPDATE
 * keeps the hint too: it qualifies the row as committed now, in a caller's SNAPSHOT
 * transaction as well. READCOMMITTEDLOCK fills the granularity slot (no ROWLOCK beside it), so
 * the bulk reads and the UPDATE are made to seek each group's row (FORCESEEK): a scan of
 * Groups could take page locks, held to the caller's commit, which READPAST claims of the
 * other groups on those pages cannot skip.
 */
export function activateGroups(schema: string, groups: string): string {
  const headOf = `  UPDATE g
  SET [HeadId] = h.[Id], [HeadReadyAt] = h.[RunAt], [HeadPriority] = h.[Priority], [Waiting] = ${waitingFor('h.[RunAt]')},
      [UpdatedAt] = SYSUTCDATETIME()
  FROM ${groups} AS g WITH (READCOMMITTEDLOCK, FORCESEEK)
  INNER JOIN @heads AS h ON g.[Queue] = h.[Queue] AND g.[GroupKey] = h.[GroupKey]
  WHERE g.[HeldToken] IS NULL AND g.[Blocked] = 0 AND (g.[HeadId] IS NULL OR g.[HeadId] > h.[Id]);`;
  const found = (indent: string, extra: string) => `${indent}UPDATE h SET [Found] = 1
${indent}FROM @heads AS h
${indent}WHERE ${extra}EXISTS (SELECT 1 FROM ${groups} AS g WITH (READCOMMITTEDLOCK, FORCESEEK) WHERE g.[Queue] = h.[Queue] AND g.[GroupKey] = h.[GroupKey]);`;
  return `${found('  ', '')}
  IF EXISTS (SELECT 1 FROM @heads WHERE [Found] = 0)
  BEGIN
    INSERT INTO @groupLocks ([Seq], [Resource])
    SELECT ROW_NUMBER() OVER (ORDER BY r.[Resource]), r.[Resource]
    FROM (SELECT DISTINCT ${groupLockResource(schema, 'h.[Queue]', 'h.[GroupKey]')} AS [Resource]
          FROM @heads AS h WHERE h.[Found] = 0) AS r;
    SET @groupLockCount = @@ROWCOUNT;
    WHILE @groupSeq <= @groupLockCount
    BEGIN
      SET @resource = (SELECT [Resource] FROM @groupLocks WHERE [Seq] = @groupSeq);
${takeKeyLock('      ', 'group')}
      SET @groupSeq = @groupSeq + 1;
    END;
    -- Under the locks: a row another producer created meanwhile is found, the others created.
${found('    ', 'h.[Found] = 0 AND ')}
    INSERT INTO ${groups} WITH (ROWLOCK) ([Queue], [GroupKey], [HeadId], [HeadReadyAt], [HeadPriority], [Waiting])
    SELECT [Queue], [GroupKey], [Id], [RunAt], [Priority], ${waitingFor('[RunAt]')} FROM @heads WHERE [Found] = 0;
  END;
${headOf}`;
}

/**
 * The filter of IX_Groups_Claimable, literally: a filtered index serves a query whose predicate
 * contains its filter (https://learn.microsoft.com/sql/relational-databases/indexes/create-filtered-indexes).
 */
export const CLAIMABLE_GROUP = '[HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 0';

/** The filter of IX_Groups_Waiting, literally (see CLAIMABLE_GROUP): an idle group whose head was not due when set. */
export const WAITING_GROUP = '[HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 1';

/**
 * [Waiting] of a group headed by a job that runs at `runAt` (null: no head, or a blocked one),
 * on the clock of the statement that sets the head (SYSUTCDATETIME() is read per statement, so
 * in a caller's long transaction too it is the time of the write, not of the transaction start).
 * A head due when set stays due, so IX_Groups_Claimable holds only due groups.
 */
export function waitingFor(runAt: string): string {
  return `CASE WHEN ${runAt} > SYSUTCDATETIME() THEN 1 ELSE 0 END`;
}

/**
 * How long a claim leaves a group alone when its cached head could not be leased (not
 * committed yet, rolled back, or not the group's first job any more): the head is recomputed at
 * once, and the pause keeps claimers from spinning on a producer's open transaction.
 */
export const STALE_HEAD_PAUSE_MS = 200;

/** The filter of IX_Jobs_Group, literally (see CLAIMABLE_GROUP): a group's unfinished jobs. */
export const UNFINISHED_GROUPED = "[GroupKey] IS NOT NULL AND [State] IN ('ready', 'delayed', 'leased')";

/**
 * What is wrong with a group row, by its jobs (the repair sweep's oracle, design (a)): a held
 * group needs a job leased with its token; a blocked one a dead job of the group as its head;
 * any other must be headed by its lowest unfinished job, and a row with none is not needed.
 * `row`: the alias of a row with HeadId, HeldToken, Blocked, Queue and GroupKey, or null for
 * the variables @headId, @held, @blocked, @queue, @groupKey; `first`: the lowest unfinished id.
 */
function groupProblem(jobs: string, row: string | null, first: string): string {
  const c = (column: string, variable: string) => (row ? `${row}.[${column}]` : variable);
  const [queue, key, head, held, blocked] = [
    c('Queue', '@queue'),
    c('GroupKey', '@groupKey'),
    c('HeadId', '@headId'),
    c('HeldToken', '@held'),
    c('Blocked', '@blocked'),
  ];
  return `CASE
  WHEN ${held} IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM ${jobs} AS l WITH (READUNCOMMITTED)
    WHERE l.[State] = 'leased' AND l.[GroupKey] IS NOT NULL AND l.[ClaimToken] = ${held}
      AND l.[Queue] = ${queue} AND l.[GroupKey] = ${key})
    THEN CONCAT(N'held by token ', LOWER(CAST(${held} AS char(36))), N', which no leased job of the group has')
  WHEN ${blocked} = 1 AND NOT EXISTS (
    SELECT 1 FROM ${jobs} AS d WITH (READUNCOMMITTED)
    WHERE d.[Id] = ${head} AND d.[Queue] = ${queue} AND d.[GroupKey] = ${key} AND d.[State] = 'dead')
    THEN CONCAT(N'blocked by job ', COALESCE(CAST(${head} AS nvarchar(20)), N'none'), N', which is not a dead job of the group')
  WHEN ${held} IS NULL AND ${blocked} = 0 AND ${head} IS NULL AND ${first} IS NULL
    THEN N'no unfinished job, but a row'
  WHEN ${held} IS NULL AND ${blocked} = 0 AND (${head} IS NULL OR ${first} IS NULL OR ${head} <> ${first})
    THEN CONCAT(N'head ', COALESCE(CAST(${head} AS nvarchar(20)), N'none'), N' is not the first unfinished job ',
                COALESCE(CAST(${first} AS nvarchar(20)), N'(none)'))
  END`;
}

/** BlockId of settleGroups: the lowest job of the group that died, if its queue's groups stop on one (q: QueueSettings). */
export function blockingJob(alias: string): string {
  return `MIN(CASE WHEN ${alias}.[State] = 'dead' AND q.[GroupOnDead] = 'block' THEN ${alias}.[Id] END)`;
}

/** Declarations for settleGroups: the groups a transition touched, by the token its jobs held. */
export const TOUCHED_GROUPS = `DECLARE @touched TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Token] uniqueidentifier NOT NULL, [BlockId] bigint NULL,
  PRIMARY KEY ([Queue], [GroupKey], [Token]));
`;

/** The lowest unfinished job of group `alias` (a dirty read: it sees a producer's uncommitted job). */
export function firstUnfinished(
  jobs: string,
  queue: string,
  key: string,
  columns = 'u.[Id], u.[RunAt], u.[Priority]',
): string {
  return `(SELECT TOP (1) ${columns} FROM ${jobs} AS u WITH (READUNCOMMITTED)
     WHERE u.[Queue] = ${queue} AND u.[GroupKey] = ${key} AND u.[GroupKey] IS NOT NULL
       AND u.[State] IN ('ready', 'delayed', 'leased')
     ORDER BY u.[Id])`;
}

/** Each group's lowest job of `jobs` (a table variable with Queue, GroupKey, Id, RunAt, Priority) into @heads. */
export function lowestPerGroupInto(jobs: string, indent: string): string {
  return [
    'INSERT INTO @heads ([Queue], [GroupKey], [Id], [RunAt], [Priority])',
    'SELECT f.[Queue], f.[GroupKey], f.[Id], f.[RunAt], f.[Priority]',
    'FROM (SELECT n.[Queue], n.[GroupKey], n.[Id], n.[RunAt], n.[Priority],',
    '             ROW_NUMBER() OVER (PARTITION BY n.[Queue], n.[GroupKey] ORDER BY n.[Id]) AS [Nth]',
    `      FROM ${jobs} AS n WHERE n.[GroupKey] IS NOT NULL) AS f`,
    'WHERE f.[Nth] = 1;',
  ]
    .map((line) => indent + line)
    .join('\n');
}

/** The jobs a completion or release moved on (a table variable), for their groups. */
export function movedJobsTable(name: string): string {
  return `DECLARE ${name} TABLE (
  [Id] bigint NOT NULL PRIMARY KEY, [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL, [Token] uniqueidentifier NOT NULL);
`;
}

/** Settles the groups of the grouped jobs in `moved` (a movedJobsTable), none of which died. */
export function settleMovedGroups(moved: string, jobs: string, groups: string): string {
  return `  IF EXISTS (SELECT 1 FROM ${moved} WHERE [GroupKey] IS NOT NULL)
  BEGIN
    INSERT INTO @touched ([Queue], [GroupKey], [Token])
    SELECT DISTINCT [Queue], [GroupKey], [Token] FROM ${moved} WHERE [GroupKey] IS NOT NULL;
${settleGroups(jobs, groups)}
  END;`;
}

/**
 * The group side of complete, fail, release and reap, after their job changes and in their
 * transaction: @touched lists (queue, group, token) of the grouped jobs moved, and BlockId, the
 * lowest of them that died in a queue whose groups stop on a dead job. A transition applies to
 * a group held by its token, or held by none and not blocked (a late transition after the
 * reaper let the group go); a group another token holds is left alone.
 * 1. A group batch holds the group while any of its jobs is still leased with the token: such a
 *    group is left as it is, its row not even written. (A dirty read, after this transition's
 *    own job writes: of two transitions of one token at once, say a completion and the reaper,
 *    each writes its job before it reads the other's, so at least one sees both jobs moved.)
 * 2. The rows are locked, then the jobs are read: a producer that inserted a job into the
 *    group before this lock is seen by the dirty reads below, and one that inserts after it
 *    waits for this commit in its own update of the row (activateGroups), so the job is never
 *    missed by both. Every job write of the transition came before this lock, and every job
 *    read after it is a dirty one (it never waits), so a transition never holds a group row
 *    while waiting for a job row: no cycle with a producer that holds its new job and waits for
 *    the group row.
 * 3. A job that died under 'block' becomes the head of its group, which stops.
 * 4. Else the group is released, headed by its lowest unfinished job (a job retried after a
 *    failure is its own group's head again, with its new run time).
 * 5. A group left without a head is deleted; a producer adding a job creates it again.
 */
export function settleGroups(jobs: string, groups: string, indent = '    '): string {
  const applies = `(g.[HeldToken] = t.[Token] OR (g.[HeldToken] IS NULL AND g.[Blocked] = 0))`;
  const join = `INNER JOIN @touched AS t ON g.[Queue] = t.[Queue] AND g.[GroupKey] = t.[GroupKey]`;
  return `${indent}DELETE t FROM @touched AS t
${indent}WHERE EXISTS (SELECT 1 FROM ${jobs} AS s WITH (READUNCOMMITTED)
${indent}              WHERE s.[State] = 'leased' AND s.[GroupKey] IS NOT NULL AND s.[ClaimToken] = t.[Token]);
${indent}UPDATE g SET [UpdatedAt] = SYSUTCDATETIME()
${indent}FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}WHERE ${applies};
${indent}UPDATE g
${indent}SET [HeldToken] = NULL, [Blocked] = 1, [HeadId] = t.[BlockId], [HeadReadyAt] = NULL, [HeadPriority] = NULL,
${indent}    [Waiting] = 0, [UpdatedAt] = SYSUTCDATETIME()
${indent}FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}WHERE t.[BlockId] IS NOT NULL AND ${applies};
${indent}UPDATE g
${indent}SET [HeldToken] = NULL, [HeadId] = n.[Id], [HeadReadyAt] = n.[RunAt], [HeadPriority] = n.[Priority],
${indent}    [Waiting] = ${waitingFor('n.[RunAt]')}, [UpdatedAt] = SYSUTCDATETIME()
${indent}FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}OUTER APPLY ${firstUnfinished(jobs, 'g.[Queue]', 'g.[GroupKey]')} AS n
${indent}WHERE t.[BlockId] IS NULL AND ${applies};
${indent}DELETE g FROM ${groups} AS g WITH (ROWLOCK)
${indent}${join}
${indent}WHERE g.[HeadId] IS NULL AND g.[HeldToken] IS NULL AND g.[Blocked] = 0;`;
}
