import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  MSSQL_MIGRATIONS,
  mssqlBootstrap,
  mssqlDropSchema,
  mssqlInstallScript,
  mssqlMigrationLock,
  mssqlReadVersion,
  mssqlRecordVersion,
} from '../../lib/src/store/mssql/mssql.migrations.js';
import {
  MSSQL_CALLER_TRANSACTION_GONE,
  MSSQL_OPEN_TRANSACTION,
  MSSQL_STORE_SESSION,
  mssqlQueries,
} from '../../lib/src/store/mssql/mssql.queries.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

/** Every batch the SQL Server store can send, for a default and an unusual (valid) schema name. */
function everyBatch(schema: string): [string, string][] {
  const batches: [string, string][] = Object.entries(mssqlQueries(schema)).map(([name, text]) => [
    `query ${name}`,
    text,
  ]);
  mssqlBootstrap(schema).forEach((text, i) => batches.push([`bootstrap ${i}`, text]));
  for (const migration of MSSQL_MIGRATIONS) {
    migration.batches(schema).forEach((text, i) => batches.push([`migration ${migration.version}.${i}`, text]));
  }
  batches.push(['migration lock', mssqlMigrationLock()]);
  batches.push(['read version', mssqlReadVersion(schema)]);
  batches.push(['record version', mssqlRecordVersion(schema)]);
  batches.push(['drop schema', mssqlDropSchema()]);
  mssqlInstallScript(schema)
    .split(/^GO$/m)
    .forEach((text, i) => batches.push([`install script batch ${i}`, text]));
  return batches;
}

describe('every T-SQL batch the SQL Server store emits parses as T-SQL', () => {
  for (const schema of ['sqlqueue', 'Queue_Schema_2']) {
    for (const [name, text] of everyBatch(schema)) {
      it(`${name} (schema ${schema})`, () => {
        expect(checkTsqlWithKnownGaps(text).errors).toEqual([]);
      });
    }
  }

  it('the gate rejects a store statement that a PostgreSQL habit broke', () => {
    const claim = mssqlQueries('sqlqueue').claim;
    const broken = claim
      .replace('SELECT TOP (@limit) *', 'SELECT *')
      .replace('ORDER BY [Priority] DESC, [RunAt], [Id]', 'ORDER BY [Priority] DESC LIMIT @limit');
    expect(broken).not.toBe(claim);
    expect(checkTsqlWithKnownGaps(broken).errors).not.toEqual([]);
  });

  it('the gate rejects the queue-setting upsert written the PostgreSQL way', () => {
    const upsert = mssqlQueries('sqlqueue').recordQueueSetting;
    const broken = upsert.replace(
      /UPDATE [\s\S]*VALUES \(@queue, @maxAttempts\);/,
      'INSERT INTO [sqlqueue].[QueueSettings] ([Queue], [MaxAttempts]) VALUES (@queue, @maxAttempts) ON CONFLICT ([Queue]) DO UPDATE SET [MaxAttempts] = @maxAttempts;',
    );
    expect(broken).not.toBe(upsert);
    expect(checkTsqlWithKnownGaps(broken).errors).not.toEqual([]);
  });
});

/** Store-owned: run on the store's own pooled connections, never in a caller's transaction. */
const CALLER_TRANSACTION_STATEMENTS = new Set(['enqueueOne', 'enqueueMany']);
/** A bare readiness round trip; it changes nothing and must work on any connection. */
const PLAIN_STATEMENTS = new Set(['ping']);

function storeOwned(schema = 'sqlqueue'): [string, string][] {
  return Object.entries(mssqlQueries(schema)).filter(
    ([name]) => !CALLER_TRANSACTION_STATEMENTS.has(name) && !PLAIN_STATEMENTS.has(name),
  );
}

describe('session state of the statements the SQL Server store runs on its own (issue 10, C3)', () => {
  it('the shared prefix refuses an open transaction before it sets anything, then pins the session', () => {
    const lines = MSSQL_STORE_SESSION.trim().split('\n');
    expect(lines[0]).toBe('IF @@TRANCOUNT <> 0');
    expect(lines[1]).toMatch(new RegExp(`^\\s+THROW ${MSSQL_OPEN_TRANSACTION}, N'nestjs-sql-queue: [^']+', 1;$`));
    expect(lines.slice(2)).toEqual([
      'SET NOCOUNT ON;',
      'SET IMPLICIT_TRANSACTIONS OFF;',
      'SET ROWCOUNT 0;',
      'SET TRANSACTION ISOLATION LEVEL READ COMMITTED;',
    ]);
    expect(checkTsqlWithKnownGaps(MSSQL_STORE_SESSION).errors).toEqual([]);
  });

  it('covers every statement but the two enqueues and ping', () => {
    expect(storeOwned().map(([name]) => name)).toEqual(
      expect.arrayContaining([
        'claim',
        'heartbeat',
        'complete',
        'fail',
        'release',
        'reap',
        'hasClaimableWork',
        'stats',
        'queueHealth',
        'getJob',
        'getAttempts',
        'listDead',
        'retryDead',
        'retryAllDead',
        'purgeDead',
        'cleanup',
      ]),
    );
  });

  it.each(storeOwned())('%s opens with the shared prefix', (_name, text) => {
    expect(text.startsWith(MSSQL_STORE_SESSION)).toBe(true);
  });

  it.each(storeOwned())('%s sets no other session option than XACT_ABORT for its own transaction', (_name, text) => {
    const sets = text
      .slice(MSSQL_STORE_SESSION.length)
      .match(/\bSET\s+(?!@)[A-Z_]+(?:\s+[A-Z_]+)*?\s+(?:ON|OFF|\d+|READ COMMITTED)\b/g);
    for (const set of sets ?? []) expect(set).toBe('SET XACT_ABORT ON');
  });

  it('ping stays a bare round trip', () => {
    expect(mssqlQueries('sqlqueue').ping).toBe('SELECT 1 AS [Ok];');
  });
});

const GRANULARITY_HINTS = ['PAGLOCK', 'NOLOCK', 'READCOMMITTEDLOCK', 'ROWLOCK', 'TABLOCK', 'TABLOCKX'];
const ISOLATION_HINTS = ['HOLDLOCK', 'NOLOCK', 'READCOMMITTED', 'REPEATABLEREAD', 'SERIALIZABLE'];

/** Every table-hint list in a batch: `WITH (A, B)` (index options such as DROP_EXISTING = ON have `=`). */
function hintLists(text: string): string[][] {
  return [...text.matchAll(/\bWITH\s*\(([A-Z_]+(?:\s*,\s*[A-Z_]+)*)\)/g)].map((m) => m[1]!.split(/\s*,\s*/));
}

/**
 * "SQL Server doesn't allow for more than one table hint from each of the following groups for
 * each table in the FROM clause" (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table).
 */
function hintGroupConflicts(text: string): string[] {
  const conflicts: string[] = [];
  for (const hints of hintLists(text)) {
    for (const [group, members] of [
      ['granularity', GRANULARITY_HINTS],
      ['isolation', ISOLATION_HINTS],
    ] as const) {
      const taken = hints.filter((h) => members.includes(h));
      if (taken.length > 1) conflicts.push(`${group}: ${taken.join(', ')}`);
    }
  }
  return conflicts;
}

describe('table hints (issue 10)', () => {
  const batches = everyBatch('sqlqueue');

  it.each(batches)('%s takes at most one hint from each group the table-hints page names', (_name, text) => {
    expect(hintGroupConflicts(text)).toEqual([]);
  });

  it('the group check can fail: the claim hints with ROWLOCK added are two granularity hints', () => {
    const lists = batches.flatMap(([, text]) => hintLists(text)).map((hints) => hints.join(', '));
    expect(lists).toContain('UPDLOCK, READPAST, READCOMMITTEDLOCK');
    expect(hintGroupConflicts('SELECT 1 FROM t WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK, ROWLOCK);')).toEqual([
      'granularity: READCOMMITTEDLOCK, ROWLOCK',
    ]);
  });
});

const JOBS_OR_ATTEMPTS = String.raw`\[sqlqueue\]\.\[(?:Jobs|Attempts)\]`;

interface DmlTarget {
  statement: string;
  how: string;
  hints: string[];
  /** TOP (@n) on the rows it changes, or a join to a table-valued parameter the store bounds. */
  bounded: boolean;
}

/**
 * The Jobs/Attempts rows each INSERT, UPDATE and DELETE writes, with the hints on the table
 * reference that chooses them. UPDATE forms in use: `UPDATE alias … FROM table AS alias WITH (…)
 * INNER JOIN @tvp`, and `WITH cte AS (SELECT TOP (@n) * FROM table WITH (…) …) UPDATE cte`.
 */
function dmlTargets(text: string): DmlTarget[] {
  const targets: DmlTarget[] = [];
  const hintsAfter = (at: number) => {
    const m = /^(?:\s+AS\s+\w+)?\s+WITH\s+\(([^)]*)\)/.exec(text.slice(at));
    return m ? m[1]!.split(/\s*,\s*/) : [];
  };
  for (const m of text.matchAll(new RegExp(String.raw`\bINSERT\s+INTO\s+(${JOBS_OR_ATTEMPTS})`, 'g'))) {
    targets.push({ statement: m[0], how: 'insert', hints: hintsAfter(m.index! + m[0].length), bounded: true });
  }
  for (const m of text.matchAll(
    new RegExp(String.raw`\bDELETE\s+(TOP\s*\([^)]*\)\s+)?FROM\s+(${JOBS_OR_ATTEMPTS})`, 'g'),
  )) {
    targets.push({ statement: m[0], how: 'delete', hints: hintsAfter(m.index! + m[0].length), bounded: !!m[1] });
  }
  for (const m of text.matchAll(/\bUPDATE\s+(\S+)/g)) {
    const target = m[1]!;
    // A table variable (the enqueue's @keys) or another table of the schema (QueueSettings) is
    // not in the claim path.
    if (new RegExp(String.raw`\bFROM\s+@\w+\s+AS\s+${target}\b`).test(text)) continue;
    if (/^\[sqlqueue\]\.\[\w+\]$/.test(target) && !new RegExp(`^${JOBS_OR_ATTEMPTS}$`).test(target)) continue;
    if (new RegExp(`^${JOBS_OR_ATTEMPTS}$`).test(target)) {
      targets.push({ statement: m[0], how: 'update', hints: hintsAfter(m.index! + m[0].length), bounded: false });
      continue;
    }
    // Another table of the schema, named directly (QueueSettings): not a write to Jobs or Attempts.
    if (/^\[sqlqueue\]\.\[\w+\]$/.test(target)) continue;
    const alias = new RegExp(
      String.raw`\bFROM\s+${JOBS_OR_ATTEMPTS}\s+AS\s+${target}(?:\s+WITH\s+\(([^)]*)\))?\s+INNER\s+JOIN\s+(@\w+)`,
    ).exec(text);
    const cte = new RegExp(
      String.raw`\b${target}\s+AS\s+\(\s*SELECT\s+(TOP\s*\(@\w+\)\s+)?\*\s+FROM\s+${JOBS_OR_ATTEMPTS}\s+WITH\s+\(([^)]*)\)`,
    ).exec(text);
    if (alias)
      targets.push({
        statement: m[0],
        how: `update via ${alias[2]}`,
        hints: alias[1]?.split(/\s*,\s*/) ?? [],
        bounded: true,
      });
    else if (cte)
      targets.push({ statement: m[0], how: 'update via cte', hints: cte[2]!.split(/\s*,\s*/), bounded: !!cte[1] });
    else targets.push({ statement: m[0], how: 'update (unrecognised form)', hints: [], bounded: false });
  }
  return targets;
}

/** The READPAST claims (claim, reaper) fill the granularity slot with READCOMMITTEDLOCK. */
const CLAIM_HINTS = ['UPDLOCK', 'READPAST', 'READCOMMITTEDLOCK'];

describe('writes to Jobs and Attempts (issue 10, P4/P5)', () => {
  const queries = mssqlQueries('sqlqueue');
  const writers = Object.entries(queries).filter(([, text]) => dmlTargets(text).length > 0);

  it('finds the writers', () => {
    expect(writers.map(([name]) => name).sort()).toEqual(
      [
        'claim',
        'cleanup',
        'complete',
        'enqueueMany',
        'enqueueOne',
        'fail',
        'heartbeat',
        'purgeDead',
        'reap',
        'release',
        'retryAllDead',
        'retryDead',
      ].sort(),
    );
  });

  it.each(writers)('%s takes row locks: ROWLOCK, or the claim hints on a READPAST claim', (name, text) => {
    for (const target of dmlTargets(text)) {
      const readpastClaim = (name === 'claim' || name === 'reap') && target.how === 'update via cte';
      const expected = readpastClaim ? CLAIM_HINTS : ['ROWLOCK'];
      expect(target.hints, `${name}: ${target.statement} (${target.how})`).toEqual(expected);
    }
  });

  it.each(writers)('%s never changes an unbounded set of rows', (name, text) => {
    for (const target of dmlTargets(text)) {
      expect(target.bounded, `${name}: ${target.statement} (${target.how})`).toBe(true);
    }
  });

  it('the checks can fail: a hint dropped, a whole-queue UPDATE', () => {
    const complete = queries.complete.replace('WITH (ROWLOCK)', '');
    expect(dmlTargets(complete).map((t) => t.hints)).toEqual([[]]);
    const unbounded = `UPDATE [sqlqueue].[Jobs] WITH (ROWLOCK) SET [State] = 'ready' WHERE [Queue] = @queue AND [State] = 'dead';`;
    expect(dmlTargets(unbounded)).toEqual([expect.objectContaining({ hints: ['ROWLOCK'], bounded: false })]);
    const cleanup = queries.cleanup.replace(/DELETE TOP \([^)]*\) FROM/g, 'DELETE FROM');
    expect(dmlTargets(cleanup).every((t) => !t.bounded)).toBe(true);
  });
});

interface IndexModel {
  table: string;
  keys: string[];
  include: string[];
  filter: string;
}

/** The nonclustered indexes the migrations leave, in order: CREATE, or re-key WITH (DROP_EXISTING = ON). */
function indexesAfterMigrations(): Map<string, IndexModel> {
  const indexes = new Map<string, IndexModel>();
  const list = (text: string | undefined) =>
    text
      ? text.split(',').map((c) =>
          c
            .trim()
            .replace(/\s+DESC$/, '')
            .replace(/^\[|\]$/g, ''),
        )
      : [];
  for (const migration of MSSQL_MIGRATIONS) {
    for (const batch of migration.batches('sqlqueue')) {
      const m =
        /^CREATE (?:UNIQUE )?NONCLUSTERED INDEX \[(\w+)\] ON \[sqlqueue\]\.\[(\w+)\] \(([^)]*)\)(?: INCLUDE \(([^)]*)\))?(?: WHERE (.+?))?( WITH \(DROP_EXISTING = ON\))?;$/.exec(
          batch,
        );
      if (!m) continue;
      const [, name, table, keys, include, filter, dropExisting] = m;
      expect(indexes.has(name!), `${name}: DROP_EXISTING exactly when it exists (version ${migration.version})`).toBe(
        !!dropExisting,
      );
      indexes.set(name!, { table: table!, keys: list(keys), include: list(include), filter: filter ?? '' });
    }
  }
  return indexes;
}

describe('SQL Server migrations', () => {
  it('are numbered 1..n without gaps, the latest last', () => {
    expect(MSSQL_MIGRATIONS.map((m) => m.version)).toEqual(MSSQL_MIGRATIONS.map((_, i) => i + 1));
  });

  it('version 1 is released and never edited (a change comes as a new version)', () => {
    const text = MSSQL_MIGRATIONS[0]!.batches('sqlqueue').join('\n');
    expect(createHash('sha256').update(text).digest('hex')).toBe(
      '7be75ac0ce3e3fd344d7627242b1ab1b044d05677fc6cc665fdd2031d632f073',
    );
  });
});

describe('indexes after every migration serve the queries that need them (issue 10, P1/P3)', () => {
  const indexes = indexesAfterMigrations();
  const jobsIndex = (filter: string) => [...indexes.values()].find((i) => i.table === 'Jobs' && i.filter === filter);
  const covers = (index: IndexModel | undefined, columns: string[]) =>
    columns.every((c) => index?.keys.includes(c) || index?.include.includes(c));

  it('the reaper seeks leases by expiry across queues and stops after its batch', () => {
    const leased = jobsIndex("[State] = 'leased'");
    expect(leased?.keys[0]).toBe('LeaseUntil');
    expect(mssqlQueries('sqlqueue').reap).toMatch(
      /WHERE \[State\] = 'leased' AND \[LeaseUntil\] < SYSUTCDATETIME\(\)\s+ORDER BY \[LeaseUntil\]/,
    );
    expect(covers(leased, ['LeaseUntil', 'Queue', 'Attempts'])).toBe(true);
  });

  it('the claim order is the ready index key, and the retrying figures read Attempts in it', () => {
    const ready = jobsIndex("[State] = 'ready'");
    expect(ready?.keys).toEqual(['Queue', 'Priority', 'RunAt', 'Id']);
    expect(covers(ready, ['Attempts'])).toBe(true);
  });

  it('delayed jobs wait outside the ready index, in an index the promotion reads oldest first (review P2)', () => {
    const delayed = jobsIndex("[State] = 'delayed'");
    expect(delayed?.keys).toEqual(['Queue', 'RunAt', 'Id']);
    expect(covers(delayed, ['Attempts'])).toBe(true);
    const claim = mssqlQueries('sqlqueue').claim;
    const promote = claim.indexOf("[State] = 'delayed' AND [RunAt] <= SYSUTCDATETIME()\n  ORDER BY [RunAt], [Id]");
    const lease = claim.indexOf(
      "[State] = 'ready' AND [RunAt] <= SYSUTCDATETIME()\n  ORDER BY [Priority] DESC, [RunAt], [Id]",
    );
    // Promotion first, as its own statement, so the claim that follows sees the promoted rows.
    expect(promote).toBeGreaterThan(0);
    expect(lease).toBeGreaterThan(promote);
    expect(claim).toMatch(/WITH due AS \(\n {2}SELECT TOP \(@limit\) \*\n/);
    expect(claim).toContain("UPDATE due\nSET [State] = 'ready';\nWITH candidate AS (");
  });

  it('dead jobs: pages by queue and Id, purge by age, retention across queues by FinishedAt', () => {
    const dead = jobsIndex("[State] = 'dead'");
    const deadByAge = [...indexes.values()].find((i) => i.filter === "[State] = 'dead'" && i !== dead);
    expect(dead?.keys).toEqual(['Queue', 'Id']);
    expect(covers(dead, ['FinishedAt'])).toBe(true);
    expect(deadByAge?.keys[0]).toBe('FinishedAt');
    expect(covers(deadByAge, ['IdempotencyKey'])).toBe(true);
  });

  it('done retention is one FinishedAt range for keyless and one for keyed jobs, as cleanup deletes them', () => {
    expect(jobsIndex("[State] = 'done' AND [IdempotencyKey] IS NULL")?.keys).toEqual(['FinishedAt']);
    expect(jobsIndex("[State] = 'done' AND [IdempotencyKey] IS NOT NULL")?.keys).toEqual(['FinishedAt']);
    const cleanup = mssqlQueries('sqlqueue').cleanup;
    expect(cleanup).toContain("WHERE [State] = 'done' AND [IdempotencyKey] IS NULL AND [FinishedAt] < @doneBefore");
    expect(cleanup).toContain(
      "WHERE [State] = 'done' AND [IdempotencyKey] IS NOT NULL AND [FinishedAt] < @keyedDoneBefore",
    );
  });

  it('recent failures per queue read Outcome in the attempts index', () => {
    const recent = indexes.get('IX_Attempts_Recent');
    expect(recent?.keys).toEqual(['Queue', 'FinishedAt']);
    expect(covers(recent, ['Outcome'])).toBe(true);
  });
});

describe('keyed enqueue (issue 10, C1/C2/C4/P6/S2)', () => {
  const queries = mssqlQueries('sqlqueue');
  const enqueues = [
    ['enqueueOne', queries.enqueueOne],
    ['enqueueMany', queries.enqueueMany],
  ] as const;
  const guardEnd = (text: string) => text.indexOf('END;\n') + 'END;\n'.length;

  it.each(enqueues)('%s pins what is safe in a caller transaction, the rest only in its own', (_name, text) => {
    const session = text.slice(0, guardEnd(text));
    expect(session.startsWith('SET NOCOUNT ON;\nSET IMPLICIT_TRANSACTIONS OFF;\nSET ROWCOUNT 0;\n')).toBe(true);
    // Without a caller transaction: refuses an open one; with one: refuses one that is gone.
    expect(session).toContain(`IF @inTransaction = 0 AND @@TRANCOUNT <> 0\n  THROW ${MSSQL_OPEN_TRANSACTION}, `);
    expect(session).toContain(`IF @inTransaction = 1 AND @@TRANCOUNT = 0\n  THROW ${MSSQL_CALLER_TRANSACTION_GONE}, `);
    // Isolation level and XACT_ABORT only for the transaction the statement opens itself.
    const own = /IF @inTransaction = 0\nBEGIN\n([^]*?)END;\n$/.exec(session);
    expect(
      own?.[1]
        ?.trim()
        .split('\n')
        .map((line) => line.trim()),
    ).toEqual(['SET TRANSACTION ISOLATION LEVEL READ COMMITTED;', 'SET XACT_ABORT ON;']);
    expect(session.match(/\bSET\b/g)).toHaveLength(5);
    // Nothing after the opening sets session options again.
    expect(text.slice(guardEnd(text))).not.toMatch(/\bSET\s+(?:TRANSACTION|XACT_ABORT|IMPLICIT|NOCOUNT|ROWCOUNT)\b/);
  });

  it.each(enqueues)('%s commits and rolls back only the transaction it opened itself', (_name, text) => {
    const ends = [...text.matchAll(/^.*\b(BEGIN TRANSACTION|COMMIT TRANSACTION|ROLLBACK TRANSACTION)\b.*$/gm)].map(
      (m) => m[0].trim(),
    );
    expect(ends).toEqual([
      'IF @inTransaction = 0 BEGIN TRANSACTION;',
      'IF @inTransaction = 0 COMMIT TRANSACTION;',
      'IF @inTransaction = 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;',
    ]);
    expect(text).toMatch(/BEGIN CATCH\n[^\n]*ROLLBACK TRANSACTION;\n\s+THROW;\nEND CATCH;/);
  });

  it.each(enqueues)('%s locks the key itself inside the transaction, never a key range', (_name, text) => {
    expect(text).not.toMatch(/HOLDLOCK|SERIALIZABLE|UPDLOCK/);
    const begin = text.indexOf('IF @inTransaction = 0 BEGIN TRANSACTION;');
    const lock = text.indexOf(
      "EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction';",
    );
    const check = text.search(/FROM \[sqlqueue\]\.\[Jobs\](?: AS j)? WITH \(READCOMMITTEDLOCK, FORCESEEK\)/);
    const insert = text.indexOf('INSERT INTO [sqlqueue].[Jobs] WITH (ROWLOCK)');
    expect(begin).toBeGreaterThan(0);
    expect([begin < lock, lock < check, check < insert]).toEqual([true, true, true]);
    // A result below 0 is no lock (and a deadlock on it does not roll anything back): thrown.
    expect(text).toMatch(/IF @lock < 0\n\s+BEGIN\n[^\n]+\n\s+THROW 51003, @refused, 1;\n\s+END;/);
  });

  it.each(enqueues)('%s reads keys through the filtered unique index predicate', (_name, text) => {
    const lookups = [
      ...text.matchAll(/\[IdempotencyKey\] = @idempotencyKey|\.\[IdempotencyKey\] = k\.\[IdempotencyKey\]/g),
    ];
    expect(lookups.length).toBeGreaterThan(0);
    for (const lookup of lookups) {
      const rest = text.slice(lookup.index!, text.indexOf(';', lookup.index!));
      expect(rest, rest).toMatch(/\[IdempotencyKey\] IS NOT NULL/);
    }
  });

  it('both statements lock a key under the same resource name', () => {
    const resource = (text: string, queue: string, key: string) => {
      const m =
        /N'nestjs-sql-queue:key:' \+ CONVERT\(nvarchar\(64\), HASHBYTES\('SHA2_256', CONCAT\(N'sqlqueue\/', ([^,]+), N'\/', ([^)]+)\)\), 2\)/.exec(
          text,
        );
      expect(m, 'resource expression').not.toBeNull();
      return m![0].replace(m![1]!, queue).replace(m![2]!, key);
    };
    expect(resource(queries.enqueueMany, 'Q', 'K')).toBe(resource(queries.enqueueOne, 'Q', 'K'));
    // Different schemas never share a lock; names are case-insensitive, so the hash input is not.
    expect(mssqlQueries('Other_Schema').enqueueOne).toContain("CONCAT(N'other_schema/', @queue");
  });

  it('bulk enqueue takes its key locks in one order, whatever the input order', () => {
    const text = queries.enqueueMany;
    expect(text).toContain('SELECT ROW_NUMBER() OVER (ORDER BY r.[Resource]), r.[Resource]');
    expect(text).toContain('[Resource] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL');
    expect(text).toMatch(
      /WHILE @seq <= @lockCount\n\s+BEGIN\n\s+SET @resource = \(SELECT \[Resource\] FROM @locks WHERE \[Seq\] = @seq\);/,
    );
  });

  it('bulk enqueue finds the first row of each key in one pass (no correlated self-check over the batch)', () => {
    const text = queries.enqueueMany;
    expect(text).toContain('ROW_NUMBER() OVER (PARTITION BY [Queue], [IdempotencyKey] ORDER BY [Ord]) AS [Nth]');
    expect(text.match(/FROM @jobs\b/g)).toHaveLength(4); // count, first rows, insert, answer
    expect(text).not.toMatch(/FROM @jobs AS d\b/);
    expect(text).toContain('PRIMARY KEY ([Queue], [IdempotencyKey])');
  });
});
