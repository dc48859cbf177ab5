import { describe, expect, it } from 'vitest';
import { DONE_SCAN_LIMIT, GROUP_SCAN_LIMIT, JOB_PREVIEW_CHARS } from '../../lib/src/core/types.js';
import { MSSQL_MIGRATIONS } from '../../lib/src/store/mssql/mssql.migrations.js';
import {
  DEAD_JOB,
  DELAYED_UNGROUPED,
  DONE_KEYED,
  DONE_KEYLESS,
  LEASED_JOB,
  MSSQL_STORE_SESSION,
  READY_KEYED,
  READY_UNKEYED,
  UNFINISHED_GROUPED,
  mssqlQueries,
  type MssqlQueries,
} from '../../lib/src/store/mssql/mssql.queries.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

const queries = mssqlQueries('sqlqueue');
const jobs = '[sqlqueue].[Jobs]';
const LISTINGS = ['listReadyJobs', 'listDelayedJobs', 'listLeasedJobs', 'listDoneJobs', 'listDeadJobs'] as const;
const DASHBOARD = [
  ...LISTINGS,
  'recordThroughput',
  'readThroughput',
  'cleanupThroughput',
  'purgeDeadIds',
] as const satisfies readonly (keyof MssqlQueries)[];

/** Whitespace collapsed, for matching statements across line breaks. */
const flat = (text: string) => text.replace(/\s+/g, ' ');

/** The filter each index has after every migration (the last CREATE … WHERE of that name). */
function indexFilters(): Map<string, string> {
  const filters = new Map<string, string>();
  for (const migration of MSSQL_MIGRATIONS) {
    for (const batch of migration.batches('sqlqueue')) {
      const m =
        /^CREATE (?:UNIQUE )?NONCLUSTERED INDEX \[(\w+)\] ON [^ ]+ \([^)]*\)(?: INCLUDE \([^)]*\))?(?: WHERE (.+?))?(?: WITH \([^)]*\))?;$/.exec(
          flat(batch),
        );
      if (m) filters.set(m[1]!, m[2] ?? '');
    }
  }
  return filters;
}

/**
 * Each keyset read of Jobs that appends to @page what the page still needs (never waiting on a
 * writer): its WHERE and ORDER BY. A read of two indexes (ready jobs without and with a key) is
 * two such reads, each bounded, merged. The grouped part's bounded read has a shape of its own.
 */
function pageReads(text: string): { where: string; orderBy: string }[] {
  return [
    ...flat(text).matchAll(
      /SELECT TOP \(@want - @got\) (?:@got \+ ROW_NUMBER\(\) OVER \(ORDER BY [^)]*\), 1, )?\[Id\], [^;]*? FROM \[sqlqueue\]\.\[Jobs\] WITH \(READPAST, READCOMMITTEDLOCK\) WHERE ([^;]*?) ORDER BY ([^;()]*?)(?:\) AS r\d+|;)/g,
    ),
  ].map((m) => ({ where: m[1]!, orderBy: m[2]! }));
}

/** Every read of Jobs in a statement, from its FROM to the end of its WHERE. */
const jobReads = (text: string) =>
  flat(text).match(/FROM \[sqlqueue\]\.\[Jobs\] WITH \([^)]*\) WHERE [^;]*?(?= ORDER BY|;)/g) ?? [];

describe('SQL Server dashboard statements: the T-SQL gate and the indexes they read', () => {
  it.each(DASHBOARD)('%s parses as T-SQL and opens with the store session prefix', (name) => {
    expect(checkTsqlWithKnownGaps(queries[name]).errors).toEqual([]);
    expect(queries[name].startsWith(MSSQL_STORE_SESSION)).toBe(true);
  });

  it('version 8 creates the throughput table, keyed (Minute, Queue), and the type a flush binds; both parse', () => {
    const v8 = MSSQL_MIGRATIONS.find((m) => m.version === 8)!;
    expect(v8.description).toBe('throughput');
    const [table, type] = v8.batches('sqlqueue');
    expect(table).toContain('CONSTRAINT [PK_Throughput] PRIMARY KEY CLUSTERED ([Minute], [Queue])');
    // The dialect's conventions: datetime2(3) times, binary queue names, as every other table.
    expect(table).toContain('[Minute] datetime2(3) NOT NULL');
    expect(table).toContain('[Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL');
    for (const column of ['Completed', 'Failed', 'Dead']) expect(table).toContain(`[${column}] bigint NOT NULL`);
    expect(type).toContain('[Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY');
    for (const batch of v8.batches('Queue_Schema_2')) expect(checkTsqlWithKnownGaps(batch).errors).toEqual([]);
  });

  it('the filters the listings name are the filters of the indexes that serve each state, literally', () => {
    const filters = indexFilters();
    expect(filters.get('IX_Jobs_Claim')).toBe(READY_UNKEYED);
    expect(filters.get('IX_Jobs_KeyReady')).toBe(READY_KEYED);
    expect(filters.get('IX_Jobs_Delayed')).toBe(DELAYED_UNGROUPED);
    expect(filters.get('IX_Jobs_Leased')).toBe(LEASED_JOB);
    expect(filters.get('IX_Jobs_Dead')).toBe(DEAD_JOB);
    expect(filters.get('IX_Jobs_Done')).toBe(DONE_KEYLESS);
    expect(filters.get('IX_Jobs_DoneKeyed')).toBe(DONE_KEYED);
    expect(filters.get('IX_Jobs_Group')).toBe(UNFINISHED_GROUPED);
  });

  const walks: [string, string, string, string][] = [
    // statement, index filter, ORDER BY (the index's key order), the position's last condition
    ['listReadyJobs', READY_UNKEYED, '[Priority] DESC, [RunAt], [Id]', '[Priority] < @fromInt'],
    ['listReadyJobs', READY_KEYED, '[Priority] DESC, [RunAt], [Id]', '[Priority] < @fromInt'],
    ['listDelayedJobs', DELAYED_UNGROUPED, '[RunAt], [Id]', '[RunAt] > @fromAt'],
    ['listLeasedJobs', LEASED_JOB, '[LeaseUntil], [Queue], [Id]', '[LeaseUntil] > @fromAt'],
    ['listDeadJobs', DEAD_JOB, '[Id] DESC', '[Id] < @fromId'],
  ];

  it.each(walks)(
    '%s reads %s in index order, one range per key column, each bounded by what the page still needs',
    (name, filter, orderBy, widest) => {
      const reads = pageReads(queries[name as keyof MssqlQueries]).filter((r) =>
        r.where.startsWith(`[Queue] = @queue AND ${filter} AND `),
      );
      const columns = orderBy.split(', ').filter((c) => c !== '[Queue]').length;
      expect(reads).toHaveLength(columns);
      for (const read of reads) {
        expect(read.orderBy).toBe(orderBy);
        // Equalities on the leading columns, one range on the next: no OR, which would bound the seek by its first column only.
        expect(read.where).not.toMatch(/\bOR\b/);
      }
      // From the deepest position (equal on every column but Id) to the widest (past the first column).
      expect(reads.at(-1)!.where.endsWith(widest)).toBe(true);
      expect(reads[0]!.where).toMatch(/\[Id\] [<>] @fromId$/);
    },
  );

  it('every listing read is one of those walks: no read of Jobs outside an index filter', () => {
    for (const name of LISTINGS) {
      for (const read of pageReads(queries[name])) {
        expect(
          walks.some(
            ([statement, filter]) => statement === name && read.where.startsWith(`[Queue] = @queue AND ${filter} AND `),
          ),
          `${name}: ${read.where}`,
        ).toBe(true);
      }
    }
    // Done reads no page range by queue: see the next tests.
    expect(pageReads(queries.listDoneJobs)).toEqual([]);
    // Ready and delayed: the keyset walks of the ungrouped part and the grouped part's two ranges.
    for (const [name, keys] of [
      ['listReadyJobs', 6],
      ['listDelayedJobs', 2],
    ] as const) {
      const grouped = jobReads(queries[name]).filter((read) => read.includes(UNFINISHED_GROUPED));
      expect(grouped).toHaveLength(2);
      expect(jobReads(queries[name])).toHaveLength(keys + grouped.length);
    }
  });

  it.each(['ready', 'delayed'] as const)(
    `the %s listing's grouped part reads at most ${GROUP_SCAN_LIMIT} entries of IX_Jobs_Group, and checks the state after`,
    (state) => {
      const text = flat(queries[state === 'ready' ? 'listReadyJobs' : 'listDelayedJobs']);
      const range = (after: string) =>
        `SELECT TOP (${GROUP_SCAN_LIMIT}) [Id], [GroupKey], [State] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${UNFINISHED_GROUPED} AND ${after} ORDER BY [GroupKey], [Id]) AS`;
      // The position's two ranges, in index order, no OR (which would bound the seek by GroupKey
      // only), each bounded, merged and bounded again: the entries read, counted by N.
      const rest = range('[GroupKey] = @fromText AND [Id] > @fromId');
      const after = range('[GroupKey] > @fromText');
      expect(text).toContain(rest);
      expect(text).toContain(after);
      expect(text.indexOf(rest)).toBeLessThan(text.indexOf(after));
      expect(text).toContain(
        `SELECT TOP (${GROUP_SCAN_LIMIT}) e.[Id], e.[GroupKey], e.[State], ROW_NUMBER() OVER (ORDER BY e.[GroupKey], e.[Id]) AS [N] FROM ( SELECT a.* FROM (`,
      );
      expect(text).toContain(') AS b) AS e ORDER BY e.[GroupKey], e.[Id]) AS r');
      // Then the state, on what was read: the jobs in it, and the last entry read at the bound.
      expect(text).toContain(
        `WHERE r.[State] = '${state}' OR r.[N] = ${GROUP_SCAN_LIMIT} ORDER BY r.[GroupKey], r.[Id]; SET @got = @got + @@ROWCOUNT; END;`,
      );
      expect(text).toContain(
        `IF @got < @want BEGIN SELECT @fromText = CASE WHEN @part = 2 THEN @keyText ELSE N'' END, @fromId = CASE WHEN @part = 2 THEN @keyId ELSE 0 END; INSERT INTO @page ([Seq], [Part], [Id], [KeyInt], [KeyAt], [KeyText], [ScanEnd]) SELECT TOP (@want - @got) @got + ROW_NUMBER() OVER (ORDER BY r.[GroupKey], r.[Id]), 2, r.[Id], NULL, NULL, r.[GroupKey], CASE WHEN r.[N] = ${GROUP_SCAN_LIMIT} THEN 1 ELSE 0 END FROM (`,
      );
      // No read of the group index without the bound.
      const groupReads = jobReads(text).filter((read) => read.includes(UNFINISHED_GROUPED));
      expect(groupReads).toHaveLength(2);
      expect(text.split(`SELECT TOP (${GROUP_SCAN_LIMIT}) [Id], [GroupKey], [State] FROM ${jobs}`)).toHaveLength(3);
      // The listed rows say which one ended the read.
      expect(text).toContain('SELECT p.[Part], p.[KeyInt], p.[KeyAt], p.[KeyText], p.[ScanEnd],');
      expect(text).toContain('[ScanEnd] bit NOT NULL DEFAULT 0);');
    },
  );

  it('the done listing looks through the most recent completions of both done indexes, merged, bounded by DONE_SCAN_LIMIT', () => {
    const text = flat(queries.listDoneJobs);
    for (const filter of [DONE_KEYLESS, DONE_KEYED]) {
      const read = `SELECT TOP (${DONE_SCAN_LIMIT}) [FinishedAt], [Id] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE ${filter} ORDER BY [FinishedAt] DESC, [Id] DESC)`;
      // Once for the page, once for the count of the window when the page is not full.
      expect(text.split(read)).toHaveLength(3);
    }
    expect(text).toContain(
      `UNION ALL SELECT b.* FROM ( SELECT TOP (${DONE_SCAN_LIMIT}) [FinishedAt], [Id] FROM ${jobs} WITH (READPAST, READCOMMITTEDLOCK) WHERE ${DONE_KEYED}`,
    );
    expect(text).toContain(
      `ORDER BY m.[FinishedAt] DESC, m.[Id] DESC) AS w INNER JOIN ${jobs} AS j WITH (FORCESEEK, READPAST, READCOMMITTEDLOCK) ON j.[Id] = w.[Id]`,
    );
    // The position applies after the window is taken, newest first, ties by id.
    expect(text).toContain(
      "WHERE j.[Queue] = @queue AND j.[State] = 'done' AND w.[FinishedAt] <= @fromAt AND (w.[FinishedAt] < @fromAt OR w.[Id] < @fromId)",
    );
    expect(text).toContain('IF @got < @want SET @scanned = (SELECT COUNT_BIG(*) FROM (SELECT TOP');
    expect(text.endsWith('SELECT @scanned AS [Scanned];')).toBe(true);
  });

  it.each(LISTINGS)('%s reads the listed rows by primary key, with previews cut in SQL and no payload', (name) => {
    const text = flat(queries[name]);
    const state = {
      listReadyJobs: 'ready',
      listDelayedJobs: 'delayed',
      listLeasedJobs: 'leased',
      listDoneJobs: 'done',
      listDeadJobs: 'dead',
    }[name];
    expect(text).toContain(
      `FROM @page AS p LEFT JOIN ${jobs} AS j WITH (FORCESEEK, READPAST, READCOMMITTEDLOCK) ON j.[Id] = p.[Id] AND j.[State] = '${state}' ORDER BY p.[Seq];`,
    );
    expect(text).toContain(
      `CAST(LEFT(j.[Payload], ${JOB_PREVIEW_CHARS}) AS nvarchar(${JOB_PREVIEW_CHARS})) AS [PayloadPreview]`,
    );
    expect(text).toContain(
      `CAST(LEFT(j.[LastError], ${JOB_PREVIEW_CHARS}) AS nvarchar(${JOB_PREVIEW_CHARS})) AS [LastErrorPreview]`,
    );
    expect(text.replace(/LEFT\(j\.\[(?:Payload|LastError)\], \d+\)/g, '')).not.toMatch(
      /\[Payload\]|\[LastError\]|\[ClaimToken\]/,
    );
    // A listing only reads, and never waits on a writer: every read of Jobs skips locked rows
    // (READPAST with the locking read it needs), none takes update locks or reads uncommitted rows.
    const jobReads = text.match(/\[sqlqueue\]\.\[Jobs\]( AS \w+)?( WITH \([^)]*\))?/g)!;
    expect(jobReads.length).toBeGreaterThan(0);
    for (const read of jobReads) expect(read).toMatch(/WITH \((FORCESEEK, )?READPAST, READCOMMITTEDLOCK\)$/);
    expect(text).not.toMatch(/UPDLOCK|NOLOCK|READUNCOMMITTED|HOLDLOCK|BEGIN TRANSACTION/);
  });

  it('the throughput flush upserts a queue at a time in queue order, the key held to commit, in one transaction', () => {
    const text = flat(queries.recordThroughput);
    expect(text).not.toMatch(/\bMERGE\b/);
    expect(text).toContain(
      'DECLARE @minute datetime2(3) = DATEADD(minute, DATEDIFF(minute, DATETIME2FROMPARTS(2000, 1, 1, 0, 0, 0, 0, 3), @now), DATETIME2FROMPARTS(2000, 1, 1, 0, 0, 0, 0, 3));',
    );
    expect(text).toContain('DECLARE @queue nvarchar(128) = (SELECT MIN([Queue]) FROM @counts)');
    expect(text).toContain('SET @queue = (SELECT MIN([Queue]) FROM @counts WHERE [Queue] > @queue);');
    const begin = text.indexOf('BEGIN TRANSACTION;');
    const update = text.indexOf('UPDATE [sqlqueue].[Throughput] WITH (UPDLOCK, HOLDLOCK)');
    const insert = text.indexOf('IF @@ROWCOUNT = 0 INSERT INTO [sqlqueue].[Throughput]');
    const commit = text.indexOf('COMMIT TRANSACTION;');
    expect([begin < update, update < insert, insert < commit]).toEqual([true, true, true]);
    expect(text).toContain('WHERE [Minute] = @minute AND [Queue] = @queue;');
    expect(text).toContain(
      'SET [Completed] = [Completed] + @completed, [Failed] = [Failed] + @failed, [Dead] = [Dead] + @dead',
    );
  });

  it('the throughput read is one range of the key from the start of the minute @minutes - 1 before now', () => {
    const text = flat(queries.readThroughput);
    expect(text).toContain(
      'DECLARE @since datetime2(3) = DATEADD(minute, DATEDIFF(minute, DATETIME2FROMPARTS(2000, 1, 1, 0, 0, 0, 0, 3), @now) - @minutes + 1, DATETIME2FROMPARTS(2000, 1, 1, 0, 0, 0, 0, 3));',
    );
    expect(text).toContain(
      'SELECT @now AS [Now]; SELECT [Minute], [Queue], [Completed], [Failed], [Dead] FROM [sqlqueue].[Throughput] WHERE [Minute] >= @since ORDER BY [Minute], [Queue];',
    );
    expect(flat(queries.cleanupThroughput)).toContain(
      'DELETE TOP (@batch) FROM [sqlqueue].[Throughput] WITH (ROWLOCK) WHERE [Minute] <',
    );
  });

  it('purging by id is the purge with one more condition, and keeps the blocked-group release', () => {
    const [withIds, all] = [queries.purgeDeadIds, queries.purgeDead];
    expect(withIds.replace('\n    AND [Id] IN (SELECT i.[Id] FROM @ids AS i)', '')).toBe(all);
    expect(withIds).toContain('OUTPUT inserted.[Queue], inserted.[GroupKey] INTO @unblocked');
  });
});
