// Listings: a job and its attempts, dead jobs, and the dashboard's keyset-paged job lists.
import { DONE_SCAN_LIMIT, GROUP_SCAN_LIMIT, JOB_PREVIEW_CHARS } from '../../../core/types.js';
import { UNFINISHED_GROUPED } from './groups.queries.js';
import { MSSQL_STORE_SESSION } from './session.js';
import { READY_KEYED, READY_UNKEYED } from './shared.js';
import type { MssqlTables } from './tables.js';

export function getJob(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}SELECT ${JOB_COLUMNS} FROM ${jobs} WHERE [Id] = @id;`;
}

// @id. getJob with a locking read, also where READ_COMMITTED_SNAPSHOT is on: it waits for a
// transaction still holding the row (a handler's commit whose reply was lost) to end, instead of
// reading the version from before it: the READCOMMITTEDLOCK table hint makes the read take shared
// locks as READ COMMITTED does with READ_COMMITTED_SNAPSHOT OFF, instead of row versioning
// (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table). Live test: the
// handler-transaction contract's readBack case.
export function getJobAfterWriters(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}SELECT ${JOB_COLUMNS} FROM ${jobs} WITH (READCOMMITTEDLOCK) WHERE [Id] = @id;`;
}

export function getAttempts(t: MssqlTables): string {
  const { jobs, attempts } = t;
  return `${MSSQL_STORE_SESSION}SELECT [Attempt], [Outcome], [Error], [Stack], [WorkerId], [StartedAt], [FinishedAt]
FROM ${attempts} WHERE [JobId] = @id
UNION ALL
SELECT [Attempts], 'completed', NULL, NULL, [WorkerId], [ClaimedAt], [FinishedAt]
FROM ${jobs} WHERE [Id] = @id AND [State] = 'done'
ORDER BY [FinishedAt], [Attempt];`;
}

// @queue, @afterId (null for the first page), @limit
// ORDER BY names the table's column: the select list's [Id] is text and would sort 10 before 9.
// ISNULL keeps the predicate a seek on IX_Jobs_Dead for every page (ids start at 1).
export function listDead(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}SELECT TOP (@limit) ${JOB_COLUMNS} FROM ${jobs} AS j
WHERE j.[Queue] = @queue AND j.[State] = 'dead' AND j.[Id] > ISNULL(@afterId, 0)
ORDER BY j.[Id];`;
}

// Each listing reads its page of ids through the filtered index that already serves the
// state, by keyset (after the last job listed, never OFFSET), its filter named literally, then
// reads those rows only (listedJobs). Every one takes @queue, @limit (1..500, checked by the
// store), and the cursor's position: @part (null for a first page; 1 the ungrouped part, 2
// the grouped one), @keyInt (priority), @keyAt (run time, lease end or finish time), @keyText
// (group key), @keyId. A first page starts from a position before every job.
// Every read carries LIST_HINTS: rows locked at this instant are left out of the page.
// Claim order through IX_Jobs_Claim (priority descending, run time, id; the position's
// priority from 2^31 - 1 for a first page), merged with the queue's keyed ready jobs
// (IX_Jobs_KeyReady, in key order: a top-N sort over them, as on PostgreSQL), then the grouped
// part.
export function listReadyJobs(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}${LIST_PAGE}${ungroupedPart(
    jobs,
    [READY_UNKEYED, READY_KEYED],
    `@fromInt = ISNULL(@keyInt, 2147483647), @fromAt = ISNULL(@keyAt, ${EARLIEST}), @fromId = ISNULL(@keyId, 0)`,
    [
      { column: 'Priority', desc: true, from: '@fromInt' },
      { column: 'RunAt', from: '@fromAt' },
      { column: 'Id', from: '@fromId' },
    ],
  )}${groupedPart(jobs, 'ready')}${listedJobs(jobs, 'ready')}`;
}

// Run time and id through IX_Jobs_Delayed, then the grouped part.
export function listDelayedJobs(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}${LIST_PAGE}${ungroupedPart(
    jobs,
    DELAYED_UNGROUPED,
    `@fromAt = ISNULL(@keyAt, ${EARLIEST}), @fromId = ISNULL(@keyId, 0)`,
    [
      { column: 'RunAt', from: '@fromAt' },
      { column: 'Id', from: '@fromId' },
    ],
  )}${groupedPart(jobs, 'delayed')}${listedJobs(jobs, 'delayed')}`;
}

// Lease end and id through IX_Jobs_Leased ([LeaseUntil], [Queue], then Id as every
// nonclustered index carries the clustered key): with one queue, its order is (LeaseUntil, Id),
// so ORDER BY names Queue too and needs no sort. The index is led by LeaseUntil (the reaper's
// order), so the queue is checked in it: leased rows are as many as running handlers.
export function listLeasedJobs(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}${LIST_PAGE}SELECT @fromAt = ISNULL(@keyAt, ${EARLIEST}), @fromId = ISNULL(@keyId, 0);
${keysetWalk(
  jobs,
  1,
  LEASED_JOB,
  [
    { column: 'LeaseUntil', from: '@fromAt' },
    { column: 'Id', from: '@fromId' },
  ],
  '[LeaseUntil], [Queue], [Id]',
)}
${listedJobs(jobs, 'leased')}`;
}

// Newest first among the DONE_SCAN_LIMIT most recent completions of all queues
// (recentCompletions: done rows are not indexed by queue), the queue's kept by a seek per
// completion until the page is full, from the position (FinishedAt, Id) down; ties on
// FinishedAt (one completion statement's jobs) are passed over in the window, never looked up.
// A second result, Scanned: the window's size when the page is not full (DONE_SCAN_LIMIT: the
// queue may have older done jobs that no page lists).
export function listDoneJobs(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}${LIST_PAGE}DECLARE @scanned bigint = 0;
SELECT @fromAt = ISNULL(@keyAt, ${LATEST}), @fromId = ISNULL(@keyId, ${BIGINT_MAX});
INSERT INTO @page ([Seq], [Part], [Id], [KeyInt], [KeyAt], [KeyText])
SELECT TOP (@want) ROW_NUMBER() OVER (ORDER BY w.[FinishedAt] DESC, w.[Id] DESC), 1, w.[Id], NULL, w.[FinishedAt], NULL
FROM ${recentCompletions(jobs)} AS w
INNER JOIN ${jobs} AS j WITH (FORCESEEK, ${LIST_HINTS}) ON j.[Id] = w.[Id]
WHERE j.[Queue] = @queue AND j.[State] = 'done' AND w.[FinishedAt] <= @fromAt AND (w.[FinishedAt] < @fromAt OR w.[Id] < @fromId)
ORDER BY w.[FinishedAt] DESC, w.[Id] DESC;
SET @got = @@ROWCOUNT;
IF @got < @want
  SET @scanned = (SELECT COUNT_BIG(*) FROM ${recentCompletions(jobs)} AS c);
${listedJobs(jobs, 'done')}
SELECT @scanned AS [Scanned];`;
}

// Newest first (Id descending) through IX_Jobs_Dead, a backward range from the position.
export function listDeadJobs(t: MssqlTables): string {
  const { jobs } = t;
  return `${MSSQL_STORE_SESSION}${LIST_PAGE}SELECT @fromId = ISNULL(@keyId, ${BIGINT_MAX});
${keysetWalk(jobs, 1, DEAD_JOB, [{ column: 'Id', desc: true, from: '@fromId' }])}
${listedJobs(jobs, 'dead')}`;
}

const JOB_COLUMNS = `CAST([Id] AS varchar(20)) AS [Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey],
  [IdempotencyKey], [Attempts], [MaxAttempts], CAST([ClaimToken] AS char(36)) AS [ClaimToken], [LeaseUntil], [WorkerId],
  [CreatedAt], [ClaimedAt], [FinishedAt], [LastError], [CancelRequestedAt], [CancelReason], [Result], [Progress],
  [ConcurrencyKey]`;

/** The filters of the indexes the listings read, literally (see CLAIMABLE_GROUP; READY_UNKEYED, READY_KEYED). */

export const DELAYED_UNGROUPED = "[State] = 'delayed' AND [GroupKey] IS NULL";

export const LEASED_JOB = "[State] = 'leased'";

export const DEAD_JOB = "[State] = 'dead'";

export const DONE_KEYLESS = "[State] = 'done' AND [IdempotencyKey] IS NULL";

export const DONE_KEYED = "[State] = 'done' AND [IdempotencyKey] IS NOT NULL";

/**
 * Every read of a listing: a dashboard never waits on a writer and never holds one up. READPAST
 * leaves out the rows locked at this instant (an enqueue not committed yet, a claim or completion
 * in flight), as queueHealth leaves them out of its counts; the next refresh shows them. Without it,
 * locking READ COMMITTED would wait on such rows, and would keep its shared locks on the rows whose
 * payload and error (nvarchar(max)) it reads until the statement ends, where a worker completing
 * one could deadlock with it. READCOMMITTEDLOCK: READPAST requires a locking read, also when
 * READ_COMMITTED_SNAPSHOT is on (see CLAIM_HINTS).
 */
const LIST_HINTS = 'READPAST, READCOMMITTEDLOCK';

/** Times no job sorts before, or after: a first page's position. */
const EARLIEST = 'DATETIME2FROMPARTS(1, 1, 1, 0, 0, 0, 0, 3)';

const LATEST = 'DATETIME2FROMPARTS(9999, 12, 31, 23, 59, 59, 999, 3)';

const BIGINT_MAX = '9223372036854775807';

/**
 * Opens every listing. @page holds the page's jobs in order, each with the sort key it was read
 * at (the next page's cursor comes from it), filled by bounded index reads until it holds @want
 * rows: the page and one more, which says whether a next page exists. A read starts after the
 * position in the @from variables. ScanEnd marks the last entry a grouped read took when it
 * stopped at GROUP_SCAN_LIMIT entries, whatever its state: the next page starts after it.
 */
const LIST_PAGE = `DECLARE @page TABLE (
  [Seq] int NOT NULL PRIMARY KEY, [Part] tinyint NOT NULL, [Id] bigint NOT NULL, [KeyInt] int NULL,
  [KeyAt] datetime2(3) NULL, [KeyText] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [ScanEnd] bit NOT NULL DEFAULT 0);
DECLARE @want int = @limit + 1, @got int = 0, @fromInt int, @fromAt datetime2(3), @fromText nvarchar(255), @fromId bigint;
`;

/** A listing's order column: the variable holding its value at the position (the page keeps the same column). */
interface ListKey {
  column: string;
  desc?: true;
  from: '@fromInt' | '@fromAt' | '@fromText' | '@fromId';
}

/**
 * Appends to @page, until it holds @want rows, the queue's jobs of `filter` after the position,
 * in the order of `keys` (Id last) or `orderBy` (the index's own order, when it lists more
 * columns): one read per key column, equal to the position on the columns before it and past it
 * on that one, in that order. Each is a range of the index that starts at the position, so no
 * page reads the rows of the pages before it: one predicate with ORs would bound the seek by its
 * first column only, and a bulk enqueue gives thousands of jobs one RunAt.
 */
function keysetWalk(
  jobs: string,
  part: 1 | 2,
  filter: string | readonly [string, string],
  keys: readonly ListKey[],
  orderBy = keys.map((key) => `[${key.column}]${key.desc ? ' DESC' : ''}`).join(', '),
  indent = '',
): string {
  const kept = (from: ListKey['from']) => {
    const key = keys.find((k) => k.from === from);
    return key ? `[${key.column}]` : 'NULL';
  };
  const reads: string[] = [];
  for (let k = keys.length - 1; k >= 0; k--) {
    const key = keys[k]!;
    const after = [
      ...keys.slice(0, k).map((before) => `[${before.column}] = ${before.from}`),
      `[${key.column}] ${key.desc ? '<' : '>'} ${key.from}`,
    ];
    // Two filters (two indexes): each read takes the next rows of both ranges and merges them.
    const source =
      typeof filter === 'string'
        ? [`  FROM ${jobs} WITH (${LIST_HINTS})`, `  WHERE [Queue] = @queue AND ${filter} AND ${after.join(' AND ')}`]
        : [
            '  FROM (',
            ...filter.map((one, n) =>
              [
                n === 0 ? '' : '    UNION ALL\n  ',
                `    SELECT r${n}.* FROM (SELECT TOP (@want - @got) [Id], ${keys
                  .filter((k) => k.column !== 'Id')
                  .map((k) => `[${k.column}]`)
                  .join(', ')}`,
                ` FROM ${jobs} WITH (${LIST_HINTS}) WHERE [Queue] = @queue AND ${one} AND ${after.join(' AND ')}`,
                ` ORDER BY ${orderBy}) AS r${n}`,
              ].join(''),
            ),
            '  ) AS u',
          ];
    reads.push(
      [
        'IF @got < @want',
        'BEGIN',
        '  INSERT INTO @page ([Seq], [Part], [Id], [KeyInt], [KeyAt], [KeyText])',
        `  SELECT TOP (@want - @got) @got + ROW_NUMBER() OVER (ORDER BY ${orderBy}), ${part}, [Id], ${kept('@fromInt')}, ${kept('@fromAt')}, ${kept('@fromText')}`,
        ...source,
        `  ORDER BY ${orderBy};`,
        '  SET @got = @got + @@ROWCOUNT;',
        'END;',
      ]
        .map((line) => indent + line)
        .join('\n'),
    );
  }
  return reads.join('\n');
}

/**
 * The ungrouped part of a ready or delayed listing (@part 1, or a first page): `from` sets the
 * @from variables to the cursor's position, or to one before every job.
 */
function ungroupedPart(
  jobs: string,
  filter: string | readonly [string, string],
  from: string,
  keys: readonly ListKey[],
): string {
  return `IF @part IS NULL OR @part = 1
BEGIN
  SELECT ${from};
${keysetWalk(jobs, 1, filter, keys, undefined, '  ')}
END;
`;
}

/**
 * The grouped part of a ready or delayed listing (@part 2), after the ungrouped one: at most
 * GROUP_SCAN_LIMIT entries of IX_Jobs_Group in (GroupKey, Id) order, from the cursor's position
 * in this part or from its start. The index holds the queue's grouped ready, delayed and leased
 * jobs (State is an included column, not a key), so the read is bounded first and the state
 * checked after: the jobs in `state` go to @page, as many as it still needs, and so does the
 * last entry read when the read reached its bound (ScanEnd), so the next page continues after
 * it. The position is two ranges, the rest of its group and the groups after it (an OR would
 * bound the seek by GroupKey only, and read the group's entries before the position), each
 * bounded too and merged in index order; ROW_NUMBER counts the entries read.
 */
function groupedPart(jobs: string, state: 'ready' | 'delayed'): string {
  const range = (alias: string, after: string) => `SELECT ${alias}.* FROM (
        SELECT TOP (${GROUP_SCAN_LIMIT}) [Id], [GroupKey], [State] FROM ${jobs} WITH (${LIST_HINTS})
        WHERE [Queue] = @queue AND ${UNFINISHED_GROUPED} AND ${after}
        ORDER BY [GroupKey], [Id]) AS ${alias}`;
  return `IF @got < @want
BEGIN
  SELECT @fromText = CASE WHEN @part = 2 THEN @keyText ELSE N'' END, @fromId = CASE WHEN @part = 2 THEN @keyId ELSE 0 END;
  INSERT INTO @page ([Seq], [Part], [Id], [KeyInt], [KeyAt], [KeyText], [ScanEnd])
  SELECT TOP (@want - @got) @got + ROW_NUMBER() OVER (ORDER BY r.[GroupKey], r.[Id]), 2, r.[Id], NULL, NULL, r.[GroupKey],
    CASE WHEN r.[N] = ${GROUP_SCAN_LIMIT} THEN 1 ELSE 0 END
  FROM (
    SELECT TOP (${GROUP_SCAN_LIMIT}) e.[Id], e.[GroupKey], e.[State], ROW_NUMBER() OVER (ORDER BY e.[GroupKey], e.[Id]) AS [N]
    FROM (
      ${range('a', '[GroupKey] = @fromText AND [Id] > @fromId')}
      UNION ALL
      ${range('b', '[GroupKey] > @fromText')}) AS e
    ORDER BY e.[GroupKey], e.[Id]) AS r
  WHERE r.[State] = '${state}' OR r.[N] = ${GROUP_SCAN_LIMIT}
  ORDER BY r.[GroupKey], r.[Id];
  SET @got = @got + @@ROWCOUNT;
END;
`;
}

/**
 * The page's jobs in order, as listed (JobSummary's columns, previews cut here: a page never
 * carries whole payloads), with the sort key each was read at. A job that left `state` (or the
 * table) since it was read comes back without its columns (Found 0); its key still places the
 * next page. LEFT counts UTF-16 code units unless the column's collation is supplementary-aware.
 */
function listedJobs(jobs: string, state: string): string {
  const preview = (column: string) =>
    `CAST(LEFT(j.[${column}], ${JOB_PREVIEW_CHARS}) AS nvarchar(${JOB_PREVIEW_CHARS})) AS [${column}Preview]`;
  return `SELECT p.[Part], p.[KeyInt], p.[KeyAt], p.[KeyText], p.[ScanEnd], CAST(p.[Id] AS varchar(20)) AS [Id],
  CAST(CASE WHEN j.[Id] IS NULL THEN 0 ELSE 1 END AS bit) AS [Found], j.[Queue], j.[State], j.[Priority], j.[RunAt],
  j.[GroupKey], j.[IdempotencyKey], j.[Attempts], j.[MaxAttempts], j.[LeaseUntil], j.[WorkerId], j.[CreatedAt],
  j.[ClaimedAt], j.[FinishedAt], ${preview('Payload')}, ${preview('LastError')}
FROM @page AS p
LEFT JOIN ${jobs} AS j WITH (FORCESEEK, ${LIST_HINTS}) ON j.[Id] = p.[Id] AND j.[State] = '${state}'
ORDER BY p.[Seq];`;
}

/**
 * The DONE_SCAN_LIMIT most recent completions of all queues (FinishedAt, Id), newest first: the
 * newest end of each done index (keyless and keyed jobs), merged. Keys only: no row is looked up.
 */
function recentCompletions(jobs: string): string {
  const newest = (filter: string, alias: string) => `SELECT ${alias}.* FROM (
    SELECT TOP (${DONE_SCAN_LIMIT}) [FinishedAt], [Id] FROM ${jobs} WITH (${LIST_HINTS})
    WHERE ${filter}
    ORDER BY [FinishedAt] DESC, [Id] DESC) AS ${alias}`;
  return `(SELECT TOP (${DONE_SCAN_LIMIT}) m.[FinishedAt], m.[Id] FROM (
  ${newest(DONE_KEYLESS, 'a')}
  UNION ALL
  ${newest(DONE_KEYED, 'b')}) AS m
  ORDER BY m.[FinishedAt] DESC, m.[Id] DESC)`;
}
