import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  MSSQL_MIGRATIONS,
  MSSQL_ROW_LOCKED_TABLES,
  mssqlBootstrap,
  mssqlDropSchema,
  mssqlInstallScript,
  mssqlMigrationLock,
  mssqlReadVersion,
  mssqlRecordVersion,
} from '../../lib/src/store/mssql/mssql.migrations.js';
import {
  CLAIMABLE_GROUP,
  WAITING_GROUP,
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_CALLER_TRANSACTION_GONE,
  MSSQL_NESTED_OWN_TRANSACTION,
  MSSQL_NO_STORE_TRANSACTION,
  MSSQL_OWN_TRANSACTION_GUARD,
  MSSQL_OPEN_TRANSACTION,
  MSSQL_STORE_SESSION,
  MSSQL_STORE_TRANSACTION_SESSION,
  UNPAUSED_SCHEDULE,
  mssqlQueries,
  UNFINISHED_GROUPED,
  type MssqlQueries,
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
  batches.push(['migration lock', `${MSSQL_OWN_TRANSACTION_GUARD}${mssqlMigrationLock()}`]);
  batches.push(['read version', mssqlReadVersion(schema)]);
  batches.push(['read version in autocommit', `${MSSQL_AUTOCOMMIT_SESSION}${mssqlReadVersion(schema)}`]);
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

  it.each(everyBatch('sqlqueue'))(
    '%s: each common table expression follows a statement ended with a semicolon',
    (_name, text) => {
      // "When a CTE is used in a statement that is part of a batch, the statement before it must
      // be followed by a semicolon" (WITH common_table_expression); BEGIN is no such statement.
      for (const m of text.matchAll(/\bWITH\s+\w+\s+AS\s+\(/g)) {
        const before = text.slice(0, m.index).trimEnd();
        expect(before === '' || before.endsWith(';'), text.slice(Math.max(0, m.index! - 60), m.index! + 20)).toBe(true);
      }
    },
  );

  it('walks the dashboard statements and the throughput migration too', () => {
    expect(everyBatch('sqlqueue').map(([name]) => name)).toEqual(
      expect.arrayContaining([
        ...['listReadyJobs', 'listDelayedJobs', 'listLeasedJobs', 'listDoneJobs', 'listDeadJobs'].map(
          (n) => `query ${n}`,
        ),
        ...['recordThroughput', 'readThroughput', 'cleanupThroughput', 'purgeDeadIds'].map((n) => `query ${n}`),
        'migration 8.0',
        'migration 8.1',
      ]),
    );
  });

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
      /UPDATE [\s\S]*VALUES \(@queue, @maxAttempts, @groupOnDead,[^;]*\);/,
      'INSERT INTO [sqlqueue].[QueueSettings] ([Queue], [MaxAttempts], [GroupOnDead]) VALUES (@queue, @maxAttempts, @groupOnDead) ON CONFLICT ([Queue]) DO UPDATE SET [MaxAttempts] = @maxAttempts;',
    );
    expect(broken).not.toBe(upsert);
    expect(checkTsqlWithKnownGaps(broken).errors).not.toEqual([]);
  });
});

/** Store-owned: run on the store's own pooled connections, never in a caller's transaction. */
const CALLER_TRANSACTION_STATEMENTS = new Set(['enqueueOne', 'enqueueMany', 'enqueueOneGrouped', 'enqueueManyGrouped']);
/** A bare readiness round trip; it changes nothing and must work on any connection. */
const PLAIN_STATEMENTS = new Set(['ping']);
/**
 * Run inside the store's own transaction (fireDueSchedules; a transactional handler's, which the
 * completion joins), opened with MSSQL_STORE_TRANSACTION_SESSION.
 */
const STORE_TRANSACTION_STATEMENTS = new Set(['scheduleLockDue', 'scheduleAdvance', 'completeInTransaction']);

function storeOwned(schema = 'sqlqueue'): [string, string][] {
  return Object.entries(mssqlQueries(schema)).filter(
    ([name]) =>
      !CALLER_TRANSACTION_STATEMENTS.has(name) &&
      !PLAIN_STATEMENTS.has(name) &&
      !STORE_TRANSACTION_STATEMENTS.has(name),
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
      // A deadlock with an application's transaction rolls back the store's statement, which it repeats.
      'SET DEADLOCK_PRIORITY LOW;',
    ]);
    expect(checkTsqlWithKnownGaps(MSSQL_STORE_SESSION).errors).toEqual([]);
  });

  it('covers every statement but the enqueues and ping', () => {
    expect(storeOwned().map(([name]) => name)).toEqual(
      expect.arrayContaining([
        'claim',
        'listBlockedGroups',
        'findGroupProblems',
        'repairGroup',
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

/** The tables the claim path reads, whose rows writers must lock one by one. */
const WRITTEN = String.raw`\[sqlqueue\]\.\[(?:Jobs|Attempts|Groups)\]`;

interface DmlTarget {
  statement: string;
  /** Where it starts in the batch. */
  at: number;
  table: string;
  how: string;
  hints: string[];
  /** TOP (@n) on the rows it changes, a join to a table variable the batch bounds, or one primary key. */
  bounded: boolean;
}

/**
 * The Jobs, Attempts and Groups rows each INSERT, UPDATE and DELETE writes, with the hints on
 * the table reference that chooses them. Forms in use: `UPDATE alias … FROM table AS alias WITH
 * (…) INNER JOIN @tvp`, `WITH cte AS (SELECT TOP (@n) * FROM table WITH (…) …) UPDATE cte`,
 * `UPDATE table WITH (…) SET … WHERE <primary key>`, and the same for DELETE. Each statement is
 * read up to its `;` (none of them has one inside).
 */
function dmlTargets(text: string): DmlTarget[] {
  const targets: DmlTarget[] = [];
  const statementAt = (at: number) => text.slice(at, text.indexOf(';', at));
  const hintList = (list: string | undefined) => (list ? list.split(/\s*,\s*/) : []);
  const hintsAfter = (at: number) => hintList(/^(?:\s+AS\s+\w+)?\s+WITH\s+\(([^)]*)\)/.exec(text.slice(at))?.[1]);
  // One row by the primary key of Groups (Jobs and Attempts are never written that way here).
  const byGroupKey = (statement: string) => /\[Queue\] = @queue AND \[GroupKey\] = @groupKey/.test(statement);
  for (const m of text.matchAll(new RegExp(String.raw`\bINSERT\s+INTO\s+(${WRITTEN})`, 'g'))) {
    targets.push({
      statement: m[0],
      at: m.index!,
      table: m[1]!,
      how: 'insert',
      hints: hintsAfter(m.index! + m[0].length),
      bounded: true,
    });
  }
  for (const m of text.matchAll(
    new RegExp(String.raw`\bDELETE\s+(TOP\s*\([^)]*\)\s+)?(?:(\w+)\s+)?FROM\s+(${WRITTEN})(?:\s+AS\s+(\w+))?`, 'g'),
  )) {
    const statement = statementAt(m.index!);
    const viaTable =
      m[2] !== undefined &&
      new RegExp(String.raw`\bAS\s+${m[2]}\s+WITH\s+\([^)]*\)\s+INNER\s+JOIN\s+@\w+`).test(statement);
    targets.push({
      statement: m[0],
      at: m.index!,
      table: m[3]!,
      how: viaTable ? 'delete via table variable' : 'delete',
      hints: hintsAfter(m.index! + m[0].length),
      bounded: !!m[1] || viaTable || byGroupKey(statement),
    });
  }
  for (const m of text.matchAll(/\bUPDATE\s+(\S+)/g)) {
    const target = m[1]!;
    const statement = statementAt(m.index!);
    // A table variable (@keys, @heads) or another table of the schema (QueueSettings, Schedules): not in the claim path.
    if (new RegExp(String.raw`\bFROM\s+@\w+\s+AS\s+${target}\b`).test(statement)) continue;
    if (
      new RegExp(String.raw`\bFROM\s+\[sqlqueue\]\.\[(?!(?:Jobs|Attempts|Groups)\])\w+\]\s+AS\s+${target}\b`).test(
        statement,
      )
    )
      continue;
    if (new RegExp(`^${WRITTEN}$`).test(target)) {
      targets.push({
        statement: m[0],
        at: m.index!,
        table: target,
        how: 'update',
        hints: hintsAfter(m.index! + m[0].length),
        bounded: byGroupKey(statement),
      });
      continue;
    }
    if (/^\[sqlqueue\]\.\[\w+\]$/.test(target)) continue;
    const alias = new RegExp(
      String.raw`\bFROM\s+(${WRITTEN})\s+AS\s+${target}(?:\s+WITH\s+\(([^)]*)\))?\s+INNER\s+JOIN\s+(@\w+)`,
    ).exec(statement);
    // The CTE is defined before the UPDATE: the last definition of that name before it.
    const ctes = [
      ...text
        .slice(0, m.index!)
        .matchAll(
          new RegExp(
            String.raw`\b${target}\s+AS\s+\(\s*SELECT\s+(TOP\s*\(@\w+\)\s+)?\*\s+FROM\s+(${WRITTEN})\s+WITH\s+\(([^)]*)\)`,
            'g',
          ),
        ),
    ];
    const cte = ctes[ctes.length - 1];
    if (alias)
      targets.push({
        statement: m[0],
        at: m.index!,
        table: alias[1]!,
        how: `update via ${alias[3]}`,
        hints: hintList(alias[2]),
        bounded: true,
      });
    else if (cte)
      targets.push({
        statement: m[0],
        at: m.index!,
        table: cte[2]!,
        how: 'update via cte',
        hints: hintList(cte[3]),
        bounded: !!cte[1],
      });
    else
      targets.push({
        statement: m[0],
        at: m.index!,
        table: '?',
        how: 'update (unrecognised form)',
        hints: [],
        bounded: false,
      });
  }
  return targets;
}

/** The READPAST claims (claim, reaper) fill the granularity slot with READCOMMITTEDLOCK. */
const CLAIM_HINTS = ['UPDLOCK', 'READPAST', 'READCOMMITTEDLOCK'];

/**
 * A producer's update of its group row (the head moves to its job when the group is idle or
 * headed by a later job): a locking read, which waits for a transition emptying the group,
 * also where optimized locking would read the last committed version (research A.3). With no
 * room for ROWLOCK, the bulk form (UPDATE … FROM, several groups) seeks each row (FORCESEEK);
 * the one-job form names the whole key.
 */
const isProducerHeadUpdate = (text: string, target: DmlTarget) =>
  target.table === '[sqlqueue].[Groups]' &&
  target.how.startsWith('update') &&
  /\[HeadId\] > (?:h\.\[Id\]|@firstId)/.test(text.slice(target.at, text.indexOf(';', target.at)));

describe('writes to Jobs, Attempts and Groups (issue 10, P4/P5; issue 11)', () => {
  const queries = mssqlQueries('sqlqueue');
  const writers = Object.entries(queries).filter(([, text]) => dmlTargets(text).length > 0);

  it('finds the writers', () => {
    expect(writers.map(([name]) => name).sort()).toEqual(
      [
        'cancel',
        'cancelAck',
        'claim',
        'cleanup',
        'complete',
        'completeInTransaction',
        'enqueueMany',
        'enqueueManyGrouped',
        'enqueueOne',
        'enqueueOneGrouped',
        'fail',
        'flowClaim',
        'heartbeat',
        'purgeDead',
        'purgeDeadIds',
        'postpone',
        'reap',
        'release',
        'repairGroup',
        'retryAllDead',
        'retryDead',
      ].sort(),
    );
  });

  it.each(writers)(
    "%s takes row locks: ROWLOCK, the claim hints on a READPAST claim, READCOMMITTEDLOCK on a producer's group update",
    (name, text) => {
      for (const target of dmlTargets(text)) {
        const readpastClaim = ['claim', 'flowClaim', 'reap'].includes(name) && target.how === 'update via cte';
        const expected = readpastClaim
          ? CLAIM_HINTS
          : isProducerHeadUpdate(text, target)
            ? target.how.startsWith('update via')
              ? ['READCOMMITTEDLOCK', 'FORCESEEK']
              : ['READCOMMITTEDLOCK']
            : ['ROWLOCK'];
        expect(target.hints, `${name}: ${target.statement} ${target.table} (${target.how})`).toEqual(expected);
      }
    },
  );

  it.each(writers)('%s never changes an unbounded set of rows', (name, text) => {
    for (const target of dmlTargets(text)) {
      expect(target.bounded, `${name}: ${target.statement} ${target.table} (${target.how})`).toBe(true);
    }
  });

  it('the checks can fail: a hint dropped, a whole-queue UPDATE, a producer update without its locking read', () => {
    const complete = queries.complete.replace('WITH (ROWLOCK)', '');
    expect(dmlTargets(complete).find((t) => t.table === '[sqlqueue].[Jobs]')!.hints).toEqual([]);
    const unbounded = `UPDATE [sqlqueue].[Jobs] WITH (ROWLOCK) SET [State] = 'ready' WHERE [Queue] = @queue AND [State] = 'dead';`;
    expect(dmlTargets(unbounded)).toEqual([expect.objectContaining({ hints: ['ROWLOCK'], bounded: false })]);
    const cleanup = queries.cleanup.replace(/DELETE TOP \([^)]*\) (\w+ )?FROM/g, 'DELETE $1FROM');
    expect(dmlTargets(cleanup).every((t) => !t.bounded)).toBe(true);
    const producer = queries.enqueueOneGrouped.replace(
      'UPDATE [sqlqueue].[Groups] WITH (READCOMMITTEDLOCK)',
      'UPDATE [sqlqueue].[Groups] WITH (ROWLOCK)',
    );
    const head = dmlTargets(producer).find((t) => isProducerHeadUpdate(producer, t));
    expect(head?.hints).toEqual(['ROWLOCK']);
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
        /^CREATE (?:UNIQUE )?NONCLUSTERED INDEX \[(\w+)\] ON \[sqlqueue\]\.\[(\w+)\] \(([^)]*)\)(?: INCLUDE \(([^)]*)\))?(?: WHERE (.+?))?(?: WITH \(([^)]*)\))?;$/.exec(
          batch.replace(/\s+/g, ' '),
        );
      if (!m) continue;
      const [, name, table, keys, include, filter, withOptions] = m;
      const dropExisting = /\bDROP_EXISTING = ON\b/.test(withOptions ?? '');
      expect(indexes.has(name!), `${name}: DROP_EXISTING exactly when it exists (version ${migration.version})`).toBe(
        !!dropExisting,
      );
      indexes.set(name!, { table: table!, keys: list(keys), include: list(include), filter: filter ?? '' });
    }
  }
  return indexes;
}

describe('SQL Server migrations', () => {
  it('leave page locks off on every index of the tables READPAST reads, present and future (review 2, R2-8)', () => {
    // Replays the migrations: an index is created with page locks on unless it says otherwise,
    // ALTER INDEX ALL … SET (ALLOW_PAGE_LOCKS = OFF) turns them off on the table's indexes, and a
    // DROP_EXISTING re-creation turns them on again unless it says OFF itself.
    const pageLocks = new Map<string, { table: string; on: boolean }>();
    for (const migration of MSSQL_MIGRATIONS) {
      for (const batch of migration.batches('sqlqueue')) {
        const table = /^CREATE TABLE \[sqlqueue\]\.\[(\w+)\]/.exec(batch)?.[1];
        for (const pk of batch.matchAll(/CONSTRAINT \[(\w+)\] PRIMARY KEY/g))
          pageLocks.set(pk[1]!, { table: table!, on: true });
        const index =
          /^CREATE (?:UNIQUE )?(?:NON)?CLUSTERED INDEX \[(\w+)\] ON \[sqlqueue\]\.\[(\w+)\][^]*?(?: WITH \(([^)]*)\))?;$/.exec(
            batch,
          );
        if (index) pageLocks.set(index[1]!, { table: index[2]!, on: !/ALLOW_PAGE_LOCKS = OFF/.test(index[3] ?? '') });
        const all = /^ALTER INDEX ALL ON \[sqlqueue\]\.\[(\w+)\] SET \(ALLOW_PAGE_LOCKS = OFF\);$/.exec(batch);
        if (all) for (const entry of pageLocks.values()) if (entry.table === all[1]) entry.on = false;
      }
    }
    const claimPath = [...pageLocks].filter(([, { table }]) =>
      (MSSQL_ROW_LOCKED_TABLES as readonly string[]).includes(table),
    );
    expect(claimPath.map(([name]) => name)).toEqual(
      expect.arrayContaining(['PK_Jobs', 'IX_Jobs_Claim', 'IX_Jobs_Delayed', 'IX_Jobs_Leased', 'IX_Jobs_Group']),
    );
    expect(claimPath.map(([name]) => name)).toEqual(
      expect.arrayContaining([
        'PK_Groups',
        'IX_Groups_Claimable',
        'IX_Groups_Waiting',
        'PK_Schedules',
        'IX_Schedules_Due',
      ]),
    );
    expect(claimPath.filter(([, { on }]) => on).map(([name]) => name)).toEqual([]);
  });

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

  it("the flow claim counts a queue's and a key's leased jobs with a seek that leads with Queue (review of issue 24)", () => {
    const leased = indexes.get('IX_Jobs_KeyLeased');
    expect(leased).toMatchObject({ table: 'Jobs', keys: ['Queue', 'ConcurrencyKey'], filter: "[State] = 'leased'" });
    const flow = mssqlQueries('sqlqueue').flowClaim.replace(/\s+/g, ' ');
    expect(flow).toContain("(SELECT COUNT(*) FROM [sqlqueue].[Jobs] WHERE [Queue] = @queue AND [State] = 'leased')");
    expect(flow).toContain(
      "WHERE l.[Queue] = @queue AND l.[State] = 'leased' AND l.[ConcurrencyKey] IS NOT NULL AND l.[ConcurrencyKey] = w.[Key]",
    );
  });

  it('the reaper seeks leases by expiry across queues and stops after its batch', () => {
    const leased = jobsIndex("[State] = 'leased'");
    expect(leased?.keys[0]).toBe('LeaseUntil');
    expect(mssqlQueries('sqlqueue').reap).toMatch(
      /WHERE \[State\] = 'leased' AND \[LeaseUntil\] < SYSUTCDATETIME\(\)\s+ORDER BY \[LeaseUntil\]/,
    );
    expect(covers(leased, ['LeaseUntil', 'Queue', 'Attempts'])).toBe(true);
  });

  it('the claim order is the ready index key, and the retrying figures read Attempts in it', () => {
    const ready = jobsIndex("[State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL");
    expect(ready?.keys).toEqual(['Queue', 'Priority', 'RunAt', 'Id']);
    expect(covers(ready, ['Attempts'])).toBe(true);
  });

  it('delayed jobs wait outside the ready index, in an index the promotion reads oldest first (review P2)', () => {
    const delayed = jobsIndex("[State] = 'delayed' AND [GroupKey] IS NULL");
    expect(delayed?.keys).toEqual(['Queue', 'RunAt', 'Id']);
    expect(covers(delayed, ['Attempts'])).toBe(true);
    const claim = mssqlQueries('sqlqueue').claim;
    const promote = claim.indexOf(
      "[State] = 'delayed' AND [GroupKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()\n  ORDER BY [RunAt], [Id]",
    );
    const lease = claim.indexOf(
      "[State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL AND [RunAt] <= SYSUTCDATETIME()\n    ORDER BY [Priority] DESC, [RunAt], [Id]",
    );
    // Promotion first, as its own statement, so the claim that follows sees the promoted rows.
    expect(promote).toBeGreaterThan(0);
    expect(lease).toBeGreaterThan(promote);
    expect(claim).toMatch(/WITH due AS \(\n {2}SELECT TOP \(@limit\) \*\n/);
    expect(claim).toContain("UPDATE due\nSET [State] = 'ready';\nWITH promoted AS (");
    // In both branches (no claimable group: autocommit; some: with the group side).
    expect(claim.match(/;\n {2}WITH candidate AS \(\n {4}SELECT TOP \(@jobUnits\) \*\n/g)).toHaveLength(2);
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
    ['enqueueOneGrouped', queries.enqueueOneGrouped],
    ['enqueueManyGrouped', queries.enqueueManyGrouped],
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

  it.each(enqueues)(
    "%s reads the clock once, cut to the millisecond, for the job's state and RunAt (review 2, R2-9)",
    (_name, text) => {
      const now = text.indexOf('DECLARE @now datetime2(7) = SYSUTCDATETIME();\n');
      expect(now).toBeGreaterThan(0);
      expect(text.slice(now)).toMatch(
        /^DECLARE @now datetime2\(7\) = SYSUTCDATETIME\(\);\nSET @now = DATEADD\(nanosecond, -\(DATEPART\(nanosecond, @now\) % 1000000\), @now\);\n/,
      );
      const insert = text.slice(text.indexOf('INSERT INTO [sqlqueue].[Jobs]'));
      const values = insert.slice(0, insert.search(/;\n/));
      // The state test and RunAt both use @now: a job due now is stored due by the clock of any later claim.
      expect(values).toMatch(
        /CASE WHEN COALESCE\((?:@runAt|i\.\[RunAt\]), [^]*@now\)+ > @now THEN 'delayed' ELSE 'ready' END/,
      );
      expect(values).not.toContain('SYSUTCDATETIME()');
      // A plain CAST to datetime2(3) rounds; the cut is exact.
      expect(text).not.toMatch(/CAST\(SYSUTCDATETIME\(\) AS datetime2\(3\)\)/);
    },
  );

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

  it.each([
    ['enqueueMany', queries.enqueueMany],
    ['enqueueManyGrouped', queries.enqueueManyGrouped],
  ])('%s finds the first row of each key in one pass (no correlated self-check over the batch)', (_name, text) => {
    expect(text).toContain('ROW_NUMBER() OVER (PARTITION BY [Queue], [IdempotencyKey] ORDER BY [Ord]) AS [Nth]');
    expect(text.match(/FROM @jobs\b/g)).toHaveLength(4); // count, first rows, insert, answer
    expect(text).not.toMatch(/FROM @jobs AS d\b/);
    expect(text).toContain('PRIMARY KEY ([Queue], [IdempotencyKey])');
  });
});

describe('ordered groups (issue 11)', () => {
  const queries = mssqlQueries('sqlqueue');
  const indexes = indexesAfterMigrations();
  /** Whitespace collapsed and table aliases dropped: `g.[HeldToken]` and `[HeldToken]` read alike. */
  const normal = (text: string) => text.replace(/\b\w+\.(?=\[)/g, '').replace(/\s+/g, ' ');
  /** The conjuncts a predicate must contain for the filtered index to serve it. */
  const conjuncts = (filter: string) => normal(filter).split(' AND ');
  /** Each WHERE that reads `table` (with its hints), up to the end of its predicate. */
  function readsOf(text: string, table: string): { hints: string; where: string }[] {
    const pattern = new RegExp(
      String.raw`FROM \[sqlqueue\]\.\[${table}\](?: AS \w+)?(?: WITH \(([^)]*)\))?\s+WHERE ([\s\S]*?)(?=\bORDER BY\b|;|\n\)|\) AS \w+|\)\s*THEN\b|$)`,
      'g',
    );
    return [...text.matchAll(pattern)].map((m) => ({ hints: m[1] ?? '', where: normal(m[2]!) }));
  }

  it('version 5 leaves the group indexes the statements rely on, with their literal filters', () => {
    expect(indexes.get('IX_Groups_Claimable')).toEqual({
      table: 'Groups',
      keys: ['Queue', 'HeadPriority', 'HeadReadyAt', 'HeadId'],
      include: [],
      filter: CLAIMABLE_GROUP,
    });
    // Groups whose head was not due when set wait outside the claimable index, by run time.
    expect(indexes.get('IX_Groups_Waiting')).toEqual({
      table: 'Groups',
      keys: ['Queue', 'HeadReadyAt', 'HeadId'],
      include: [],
      filter: WAITING_GROUP,
    });
    expect(CLAIMABLE_GROUP).toContain('[Waiting] = 0');
    expect(WAITING_GROUP).toBe(CLAIMABLE_GROUP.replace('[Waiting] = 0', '[Waiting] = 1'));
    expect(indexes.get('IX_Groups_Blocked')).toMatchObject({ keys: ['Queue', 'GroupKey'], filter: '[Blocked] = 1' });
    expect(indexes.get('IX_Jobs_Group')).toMatchObject({
      keys: ['Queue', 'GroupKey', 'Id'],
      filter: UNFINISHED_GROUPED,
    });
    expect(indexes.get('IX_Jobs_Group')!.include).toEqual(
      expect.arrayContaining(['State', 'RunAt', 'Priority', 'Attempts']),
    );
    expect(indexes.get('IX_Jobs_GroupHold')).toMatchObject({
      keys: ['ClaimToken'],
      filter: "[State] = 'leased' AND [GroupKey] IS NOT NULL",
    });
    // Grouped jobs leave the ungrouped claim path (and, since version 15, keyed ones); the names and keys stay.
    expect(indexes.get('IX_Jobs_Claim')).toMatchObject({
      filter: "[State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL",
    });
    expect(indexes.get('IX_Jobs_Delayed')).toMatchObject({ filter: "[State] = 'delayed' AND [GroupKey] IS NULL" });
    expect(indexes.get('IX_Jobs_DeadFinished')!.include).toEqual(['IdempotencyKey', 'Queue', 'GroupKey']);
  });

  it('version 5 adds GroupOnDead (default continue) and a group row for every group with unfinished jobs', () => {
    const v5 = MSSQL_MIGRATIONS.find((m) => m.version === 5)!.batches('sqlqueue');
    expect(v5).toContain(
      "ALTER TABLE [sqlqueue].[QueueSettings] ADD [GroupOnDead] varchar(8) NOT NULL CONSTRAINT [DF_QueueSettings_GroupOnDead] DEFAULT ('continue');",
    );
    const backfill = v5.find((b) => b.startsWith('INSERT INTO [sqlqueue].[Groups]'))!;
    // Head: the lowest unfinished job; held by the token of the lowest leased one.
    expect(normal(backfill)).toContain('ROW_NUMBER() OVER (PARTITION BY [Queue], [GroupKey] ORDER BY [Id]) AS [Nth]');
    expect(normal(backfill)).toContain("WHERE [GroupKey] IS NOT NULL AND [State] IN ('ready', 'delayed', 'leased')");
    expect(normal(backfill)).toContain("[State] = 'leased' ORDER BY [Id])");
    // A head not due yet waits.
    expect(normal(backfill)).toContain('[HeadPriority], [Waiting], [HeldToken])');
    expect(normal(backfill)).toContain('CASE WHEN [RunAt] > SYSUTCDATETIME() THEN 1 ELSE 0 END');
    expect(v5.find((b) => b.startsWith('CREATE TABLE [sqlqueue].[Groups]'))).toContain(
      '[Waiting] bit NOT NULL CONSTRAINT [DF_Groups_Waiting] DEFAULT (0),',
    );
    // The index rebuilds come before the backfill reads the new group index.
    expect(v5.indexOf(backfill)).toBe(v5.length - 1);
  });

  it("the claim's group reads contain the claimable or the waiting index's filter literally (a parameter would not match it)", () => {
    const claimable = indexes.get('IX_Groups_Claimable')!.filter;
    const waiting = indexes.get('IX_Groups_Waiting')!.filter;
    const served = (where: string) =>
      [claimable, waiting].filter((filter) => conjuncts(filter).every((c) => where.includes(c)));
    for (const name of ['claim', 'hasClaimableWork'] as const) {
      const reads = readsOf(queries[name], 'Groups');
      expect(reads.length, name).toBe(name === 'claim' ? 4 : 2);
      expect(
        reads.map((read) => served(read.where)),
        name,
      ).toEqual(name === 'claim' ? [[waiting], [claimable], [claimable], [claimable]] : [[claimable], [waiting]]);
      for (const read of reads) {
        // Only due groups: each read is a range of its index that stops at the first group not due.
        expect(read.where, `${name}: ${read.where}`).toContain('[HeadReadyAt] <= SYSUTCDATETIME()');
        expect(['READPAST, READCOMMITTEDLOCK', 'UPDLOCK, READPAST, READCOMMITTEDLOCK']).toContain(read.hints);
      }
    }
    // The check can fail: the same read with the blocked flag as a parameter.
    const broken = queries.claim.replace(/\[Blocked\] = 0/g, '[Blocked] = @blocked');
    expect(readsOf(broken, 'Groups').some((r) => served(r.where).length === 0)).toBe(true);
  });

  it('the claim first promotes due waiting groups, oldest first, as it promotes due delayed jobs (review: no walk over groups not due)', () => {
    const claim = queries.claim;
    const promote = claim.indexOf('WITH promoted AS (');
    expect(promote).toBeGreaterThan(claim.indexOf("UPDATE due\nSET [State] = 'ready';"));
    expect(promote).toBeLessThan(claim.indexOf('IF EXISTS ('));
    expect(normal(claim.slice(promote, claim.indexOf('IF EXISTS (')))).toBe(
      `WITH promoted AS ( SELECT TOP (@limit) * FROM [sqlqueue].[Groups] WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK) WHERE [Queue] = @queue AND ${WAITING_GROUP} AND [HeadReadyAt] <= SYSUTCDATETIME() ORDER BY [HeadReadyAt], [HeadId] ) UPDATE promoted SET [Waiting] = 0, [UpdatedAt] = SYSUTCDATETIME(); `,
    );
    // A stale head set aside waits; a group left without a head is deleted right after.
    expect(claim).toContain('[Waiting] = CASE WHEN n.[Id] IS NULL THEN 0 ELSE 1 END');
  });

  it('every statement that sets a group head sets [Waiting] by the head run time, on its own clock', () => {
    const headWrites: [string, string][] = [];
    for (const [name, text] of Object.entries(queries)) {
      for (const m of text.matchAll(/\b(?:UPDATE|INSERT INTO)\b[^;]*?\[HeadReadyAt\][^;]*;/g)) {
        // The claim's promotion and the group reads only filter on HeadReadyAt; these set it.
        if (/\[HeadReadyAt\] =|\[HeadReadyAt\], \[HeadPriority\]/.test(m[0]) && !/^UPDATE (?:promoted|h)\b/.test(m[0]))
          headWrites.push([name, m[0]]);
      }
    }
    expect(headWrites.map(([name]) => name)).toEqual(
      expect.arrayContaining([
        'enqueueOneGrouped',
        'enqueueManyGrouped',
        'retryDead',
        'retryAllDead',
        'complete',
        'fail',
        'release',
        'reap',
        'claim',
        'purgeDead',
        'repairGroup',
      ]),
    );
    for (const [name, statement] of headWrites) {
      expect(statement, `${name}: ${statement}`).toMatch(/\[Waiting\]/);
      const waiting = /\[Waiting\] = (CASE WHEN [^;]*? END|0)/.exec(statement);
      if (waiting && waiting[1] !== '0' && !waiting[1]!.includes('n.[Id] IS NULL'))
        expect(waiting[1], `${name}: ${statement}`).toMatch(/^CASE WHEN \S+ > SYSUTCDATETIME\(\) THEN 1 ELSE 0 END$/);
    }
  });

  it('ungrouped job reads name [GroupKey] IS NULL or a concurrency key (the claim, key and delayed indexes hold no grouped job)', () => {
    for (const name of ['claim', 'flowClaim', 'hasClaimableWork', 'stats', 'queueHealth'] as const) {
      const reads = readsOf(queries[name], 'Jobs').filter((r) => /\[State\] = '(?:ready|delayed)'/.test(r.where));
      expect(reads.length, name).toBeGreaterThan(0);
      for (const read of reads) {
        expect(read.where, `${name}: ${read.where}`).toMatch(/\[GroupKey\] IS NULL|\[ConcurrencyKey\] IS NOT NULL/);
      }
    }
  });

  it('per-group job reads contain the filter of the group index or of the held-token index', () => {
    const group = conjuncts(UNFINISHED_GROUPED);
    const hold = conjuncts(indexes.get('IX_Jobs_GroupHold')!.filter);
    let checked = 0;
    for (const [name, text] of Object.entries(queries)) {
      for (const read of readsOf(text, 'Jobs').filter((r) => r.where.includes('[GroupKey] IS NOT NULL'))) {
        checked++;
        const served = [group, hold].some((filter) => filter.every((c) => read.where.includes(c)));
        expect(served, `${name}: ${read.where}`).toBe(true);
      }
    }
    expect(checked).toBeGreaterThan(10);
  });

  const settling = ['complete', 'fail', 'release', 'reap'] as const;

  it.each(settling)(
    '%s writes its jobs before it locks a group row, and reads jobs only dirty after (no cycle with a producer)',
    (name) => {
      const text = queries[name];
      const transaction = text.slice(0, text.indexOf('COMMIT TRANSACTION;'));
      const lock = transaction.indexOf('UPDATE g SET [UpdatedAt] = SYSUTCDATETIME()');
      expect(lock).toBeGreaterThan(0);
      const before = transaction.slice(0, lock);
      const after = transaction.slice(lock);
      expect(before).not.toContain('[sqlqueue].[Groups]');
      // A batch still leased under the token keeps its group, whose row is then not written at all.
      expect(before).toContain(
        'DELETE t FROM @touched AS t\n    WHERE EXISTS (SELECT 1 FROM [sqlqueue].[Jobs] AS s WITH (READUNCOMMITTED)',
      );
      const jobReads = [...after.matchAll(/\[sqlqueue\]\.\[Jobs\](?: AS \w+)?(?: WITH \(([^)]*)\))?/g)];
      expect(jobReads.length).toBeGreaterThan(0);
      for (const read of jobReads) expect(read[1], `${name}: ${read[0]}`).toBe('READUNCOMMITTED');
      // The next head is read after the lock, in the statement that releases the group.
      expect(after).toMatch(
        /OUTER APPLY \(SELECT TOP \(1\) u\.\[Id\], u\.\[RunAt\], u\.\[Priority\] FROM \[sqlqueue\]\.\[Jobs\] AS u WITH \(READUNCOMMITTED\)/,
      );
    },
  );

  it.each(settling)('%s applies to a group held by its token, or held by none and not blocked', (name) => {
    const applies = '(g.[HeldToken] = t.[Token] OR (g.[HeldToken] IS NULL AND g.[Blocked] = 0))';
    expect(queries[name].split(applies).length - 1).toBe(3);
    // A batch holds its group while any of its jobs is leased with the token.
    expect(normal(queries[name])).toContain(
      "WHERE EXISTS (SELECT 1 FROM [sqlqueue].[Jobs] AS s WITH (READUNCOMMITTED) WHERE [State] = 'leased' AND [GroupKey] IS NOT NULL AND [ClaimToken] = [Token]);",
    );
  });

  it("fail and reap read the queue's recorded groupOnDead; a queue without one continues", () => {
    for (const name of ['fail', 'reap'] as const) {
      expect(queries[name]).toMatch(/LEFT JOIN \[sqlqueue\]\.\[QueueSettings\] AS q ON q\.\[Queue\] = \w\.\[Queue\]/);
      expect(queries[name]).toContain("q.[GroupOnDead] = 'block'");
    }
  });

  it("reap gives a group batch's jobs that never started their attempt back: no attempt row, not dead, last error kept", () => {
    const reap = queries.reap;
    const mark = reap.indexOf('UPDATE r SET [Unstarted] = 1');
    const giveBack = reap.indexOf("UPDATE j\n    SET [State] = 'ready', [Attempts] = CASE WHEN j.[Attempts] > 0");
    const history = reap.indexOf('INSERT INTO [sqlqueue].[Attempts]');
    const settle = reap.indexOf('INSERT INTO @touched');
    // After both reaping updates, before the attempt rows and the group's settling (BlockId reads the states).
    expect(reap.indexOf('INNER JOIN @batchTokens AS b ON s.[ClaimToken] = b.[Token]')).toBeLessThan(mark);
    expect(mark).toBeGreaterThan(0);
    expect(mark < giveBack && giveBack < history && history < settle).toBe(true);
    // Only the lowest job still leased under a token can have started (a batch runs in id order).
    expect(normal(reap)).toContain(
      'WHERE [GroupKey] IS NOT NULL AND EXISTS (SELECT 1 FROM @reaped AS x WHERE [Token] = [Token] AND [Id] < [Id]);',
    );
    expect(normal(reap.slice(giveBack, history))).toContain(
      '[FinishedAt] = NULL, [LastError] = [PriorError], [ClaimedAt] = NULL, [WorkerId] = NULL',
    );
    expect(reap).toContain('deleted.[LastError]\n  INTO @reaped (');
    expect(normal(reap.slice(history, settle))).toContain('FROM @reaped WHERE [Unstarted] = 0;');
    // What reap returns is what the jobs became (a never-started job cancel() marked stays canceled).
    expect(normal(reap)).toContain(
      "UPDATE r SET [State] = 'ready', [Attempt] = CASE WHEN [Attempt] > 0 THEN [Attempt] - 1 ELSE 0 END FROM @reaped AS r WHERE [Unstarted] = 1 AND [State] <> 'canceled';",
    );
  });

  it('the claim leases a group batch only from its first job at or below its cached head, in one transaction with its ungrouped jobs, and pauses a stale group', () => {
    const claim = queries.claim;
    const group = claim.slice(claim.indexOf('ELSE\nBEGIN\n  SET @jobUnits = @limit - @groupUnits;'));
    const begin = group.indexOf('BEGIN TRANSACTION;');
    const ungrouped = group.indexOf('WITH candidate AS (');
    const hold = group.indexOf('UPDATE g\n  SET [HeldToken] = NEWID()');
    const window = group.indexOf('CROSS APPLY (\n    SELECT TOP (@groupBatchSize) d.[Id]');
    const members = group.indexOf('CROSS APPLY (\n    SELECT TOP (@groupBatchSize) j.[Id], j.[State], j.[RunAt]');
    const lease = group.indexOf("SET [State] = 'leased', [ClaimToken] = h.[Token]");
    const lowerHead = group.indexOf('SET [HeadId] = f.[Id]');
    const stale = group.indexOf('SET [HeldToken] = NULL, [HeadId] = n.[Id]');
    const commit = group.indexOf('COMMIT TRANSACTION;');
    const order = [begin, ungrouped, hold, window, members, lease, lowerHead, stale, commit];
    expect(order.every((at, i, all) => at > (i ? all[i - 1]! : 0))).toBe(true);
    // The window is a dirty read of the batch's first jobs; the locked read (READPAST: never
    // waits) stops at its last id, however deep the group and however many of its jobs are
    // locked. A job leased or not due ends the batch, and so does one the locked read passed over.
    const windowRead = normal(group.slice(window, members));
    expect(windowRead).toContain('WITH (READUNCOMMITTED)');
    // Both reads start at the group's first unfinished job, not at the cached head: a lower job
    // (committed after the head was set, or retried while a later one blocked the group) is
    // leased first, and one still leased below the head stops the batch instead of running beside it.
    expect(windowRead).toContain("AND [State] IN ('ready', 'delayed', 'leased') ORDER BY [Id]");
    expect(normal(group)).toContain("AND [State] IN ('ready', 'delayed', 'leased') AND [Id] <= [LastId] ORDER BY [Id]");
    expect(normal(group)).not.toContain('[Id] >= [HeadId]');
    expect(normal(group)).toContain(
      'SET [Runnable] = 0 FROM @members AS m WHERE NOT EXISTS (SELECT 1 FROM @window AS w WHERE [Id] = [Id] AND [Seq] = [Seq]);',
    );
    // Leased when the first job is the cached head or below it (then it heads the held row); above it, stale.
    expect(normal(group)).toContain('WHERE [GroupKey] = [GroupKey] AND [Seq] = 1 AND [Id] <= [HeadId]');
    expect(normal(group.slice(lowerHead, stale))).toContain(
      'INNER JOIN @members AS f ON [GroupKey] = [GroupKey] AND [Seq] = 1 WHERE [Id] < [HeadId] AND EXISTS (SELECT 1 FROM @claimed AS c WHERE [Id] = [Id]);',
    );
    expect(normal(group)).toContain('AND [Seq] <= [Seq] AND [Runnable] = 0');
    expect(group).toContain('DATEADD(millisecond, 200, SYSUTCDATETIME())');
    // Without a claimable group, the ungrouped claim runs alone, in autocommit.
    const alone = claim.slice(claim.indexOf('IF @groupUnits = 0'), claim.indexOf('ELSE\nBEGIN'));
    expect(alone).toContain('WITH candidate AS (');
    expect(alone).not.toMatch(/BEGIN TRANSACTION|\[Groups\]/);
    // Units come back together, a batch in id order.
    expect(claim).toContain('ORDER BY [UnitPriority] DESC, [UnitAt], [UnitId], [Id];');
  });

  const producers = ['enqueueOneGrouped', 'enqueueManyGrouped', 'retryDead', 'retryAllDead'] as const;

  it.each(producers)(
    '%s reads and moves group rows with locking reads, and creates one only under the group lock',
    (name) => {
      const text = queries[name];
      const groupRefs = [...text.matchAll(/\[sqlqueue\]\.\[Groups\](?: AS (\w+))?(?: WITH \(([^)]*)\))?/g)];
      for (const ref of groupRefs) {
        expect(ref[2], `${name}: ${ref[0]}`).toBeDefined();
        expect(ref[2]).not.toMatch(/HOLDLOCK|SERIALIZABLE|REPEATABLEREAD|UPDLOCK|READPAST|NOLOCK|READUNCOMMITTED/);
        // A read joined to a set of groups seeks each row: READCOMMITTEDLOCK leaves no room for
        // ROWLOCK, and a scan could hold page locks to the caller's commit.
        if (ref[1] && ref[2]!.includes('READCOMMITTEDLOCK'))
          expect(ref[2], `${name}: ${ref[0]}`).toContain('FORCESEEK');
      }
      expect(groupRefs.some((ref) => ref[2] === 'READCOMMITTEDLOCK, FORCESEEK') || name === 'enqueueOneGrouped').toBe(
        true,
      );
      const lock = text.indexOf("N'nestjs-sql-queue:group:'");
      const recheck = text.indexOf('WITH (READCOMMITTEDLOCK', lock);
      const create = text.indexOf('INSERT INTO [sqlqueue].[Groups] WITH (ROWLOCK)');
      expect(lock).toBeGreaterThan(0);
      expect(lock < recheck && recheck < create).toBe(true);
      expect(text).toContain('nestjs-sql-queue: group lock not granted');
    },
  );

  it('no statement takes a range lock on group rows (claimers would skip neighbouring groups)', () => {
    for (const [name, text] of Object.entries(queries)) {
      for (const m of text.matchAll(/\[sqlqueue\]\.\[Groups\](?: AS \w+)? WITH \(([^)]*)\)/g)) {
        expect(m[1], name).not.toMatch(/HOLDLOCK|SERIALIZABLE|REPEATABLEREAD/);
      }
    }
  });

  it('statements without a group key keep the exact text and cost they had before issue 11', () => {
    const sha = (text: string) => createHash('sha256').update(text).digest('hex');
    // Pinned again by issue 15, whose only change to them is the trace context column (and JobInputListV3),
    // by review 2 (R2-9), whose only change is the enqueue's now read once (ENQUEUE_NOW), and by
    // issue 24, whose only change is the concurrency key column (and JobInputListV4).
    expect(sha(queries.enqueueOne)).toBe('47860abfca90afd69945d1ea73fa75f3c35bb223dc2e6b7eb867aab3faabc8d4');
    expect(sha(queries.enqueueMany)).toBe('099c4171cdb33ff120dd630308d2eb8307eb46a190c3b8f31d00c59ad8579187');
  });

  it('cleanup never deletes the dead job that blocks its group', () => {
    expect(normal(queries.cleanup)).toContain(
      'AND ([GroupKey] IS NULL OR NOT EXISTS ( SELECT 1 FROM [sqlqueue].[Groups] AS g WHERE [Blocked] = 1 AND [Queue] = [Queue] AND [GroupKey] = [GroupKey] AND [HeadId] = [Id]))',
    );
  });

  it('the repair sweep fixes a row only if unchanged since it was found and not in use, and never waits for a producer', () => {
    const repair = queries.repairGroup;
    expect(repair).toContain(
      'FROM [sqlqueue].[Groups] WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK)\n    WHERE [Queue] = @queue AND [GroupKey] = @groupKey AND CAST([RowVersion] AS bigint) = @version;',
    );
    expect(repair).toContain("@LockOwner = 'Transaction', @LockTimeout = 0;");
    expect(repair).toContain('IF @lock >= 0 AND NOT EXISTS');
    // An idle group headed by a job that is gone even to a dirty read (a producer's job, read
    // uncommitted as the next head, rolled back) is fixed but not reported: the design allows it.
    expect(normal(repair)).toContain(
      'IF @problem IS NOT NULL AND @held IS NULL AND @blocked = 0 AND @headId IS NOT NULL AND NOT EXISTS (SELECT 1 FROM [sqlqueue].[Jobs] WITH (READUNCOMMITTED) WHERE [Id] = @headId) SET @expected = 1;',
    );
    expect(repair).toContain('SELECT CASE WHEN @expected = 0 THEN @problem END AS [Problem];');
    const find = queries.findGroupProblems;
    expect(find).not.toMatch(/UPDLOCK|BEGIN TRANSACTION/);
    for (const read of readsOf(find, 'Groups'))
      expect(read.hints).toMatch(/READPAST, READCOMMITTEDLOCK|READUNCOMMITTED/);
  });

  it('every statement name the store may send exists', () => {
    const names: (keyof MssqlQueries)[] = [
      'enqueueOneGrouped',
      'enqueueManyGrouped',
      'listBlockedGroups',
      'findGroupProblems',
      'repairGroup',
    ];
    for (const name of names) expect(queries[name]).toMatch(/\S/);
  });
});

describe('recurring jobs (issue 13)', () => {
  const queries = mssqlQueries('sqlqueue');
  const indexes = indexesAfterMigrations();
  const schedules = '[sqlqueue].[Schedules]';
  /** Each INSERT, UPDATE and DELETE of Schedules (direct, or through an alias), with the hints on its table reference. */
  const writes = (text: string) => {
    const found: { statement: string; hints: string; joined: boolean }[] = [];
    const direct = /\b(?:UPDATE|DELETE FROM|INSERT INTO) \[sqlqueue\]\.\[Schedules\](?: WITH \(([^)]*)\))?/g;
    for (const m of text.matchAll(direct)) found.push({ statement: m[0], hints: m[1] ?? '', joined: false });
    for (const m of text.matchAll(/\b(UPDATE|DELETE) (\w+)\b/g)) {
      if (m[2] === 'FROM') continue;
      const statement = text.slice(m.index!, text.indexOf(';', m.index!));
      const ref = new RegExp(String.raw`FROM \[sqlqueue\]\.\[Schedules\] AS ${m[2]}(?: WITH \(([^)]*)\))?`).exec(
        statement,
      );
      if (ref)
        found.push({ statement: `${m[1]} ${m[2]}`, hints: ref[1] ?? '', joined: /INNER JOIN @\w+/.test(statement) });
    }
    return found;
  };

  it('version 7 creates Schedules and the due index the fire statement and the idle poll read', () => {
    const v7 = MSSQL_MIGRATIONS.find((m) => m.version === 7)!;
    expect(v7.description).toBe('recurring jobs');
    expect(indexes.get('IX_Schedules_Due')).toEqual({
      table: 'Schedules',
      keys: ['NextRunAt', 'Id'],
      include: [],
      filter: UNPAUSED_SCHEDULE,
    });
    const batches = v7.batches('sqlqueue');
    const table = batches.find((b) => b.startsWith(`CREATE TABLE ${schedules}`))!;
    expect(table).toContain('CONSTRAINT [PK_Schedules] PRIMARY KEY CLUSTERED ([Id])');
    expect(table).toContain("CONSTRAINT [CK_Schedules_CatchUp] CHECK ([CatchUp] IN ('none', 'last', 'all'))");
    expect(table).toContain("CONSTRAINT [CK_Schedules_Source] CHECK ([Source] IN ('options', 'api'))");
    expect(table).toContain('[Id] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL');
    expect(batches).toContain(`ALTER TABLE ${schedules} SET (LOCK_ESCALATION = DISABLE);`);
  });

  it('the statements of the store transaction refuse to run outside one, then pin the session', () => {
    const lines = MSSQL_STORE_TRANSACTION_SESSION.trim().split('\n');
    expect(lines[0]).toBe('IF @@TRANCOUNT = 0');
    expect(lines[1]).toMatch(new RegExp(`^\\s+THROW ${MSSQL_NO_STORE_TRANSACTION}, N'nestjs-sql-queue: .+', 1;$`));
    // Nor nested in a transaction the pooled connection already had: its commit would commit nothing.
    expect(lines[2]).toBe('IF @@TRANCOUNT > 1');
    expect(lines[3]).toMatch(new RegExp(`^\\s+THROW ${MSSQL_NESTED_OWN_TRANSACTION}, N'nestjs-sql-queue: .+', 1;$`));
    expect(lines.slice(4)).toEqual([
      'SET NOCOUNT ON;',
      'SET IMPLICIT_TRANSACTIONS OFF;',
      'SET ROWCOUNT 0;',
      'SET DEADLOCK_PRIORITY LOW;',
    ]);
    for (const name of ['scheduleLockDue', 'scheduleAdvance', 'completeInTransaction'] as const) {
      const text = queries[name];
      expect(text.startsWith(MSSQL_STORE_TRANSACTION_SESSION), name).toBe(true);
      expect(text.slice(MSSQL_STORE_TRANSACTION_SESSION.length), name).not.toMatch(/\bSET\s+(?!@|\[)[A-Z_]+/);
      expect(text, name).not.toMatch(/\b(?:BEGIN|COMMIT|ROLLBACK) TRANSACTION\b/);
    }
    expect(checkTsqlWithKnownGaps(MSSQL_STORE_TRANSACTION_SESSION).errors).toEqual([]);
  });

  it('the fire statement locks due schedules with the claim hints, in the due index order, and stops after @limit', () => {
    const text = queries.scheduleLockDue;
    expect(text).toContain(`FROM ${schedules} WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK)`);
    expect(text).toContain(`WHERE ${UNPAUSED_SCHEDULE} AND [NextRunAt] <= @now\nORDER BY [NextRunAt], [Id];`);
    expect(text).toMatch(/SELECT TOP \(@limit\) /);
    // The round's time is read once and returned with the rows (plan's now, scheduleAdvance's @now).
    expect(text).toContain('DECLARE @now datetime2(3) = SYSUTCDATETIME();');
    expect(text).toContain('@now AS [Now]');
  });

  it('the idle poll reads past locked rows through the due index', () => {
    const text = queries.scheduleDueIn;
    expect(text.startsWith(MSSQL_STORE_SESSION)).toBe(true);
    expect(text).toContain(`FROM ${schedules} WITH (READPAST, READCOMMITTEDLOCK)\nWHERE ${UNPAUSED_SCHEDULE};`);
    expect(text).toContain('DATEDIFF_BIG(millisecond, @now, MIN([NextRunAt])) AS [DueInMs]');
  });

  it('every write to Schedules takes row locks; the ones joined to a table type seek each row', () => {
    const found = Object.entries(queries).flatMap(([name, text]) => writes(text).map((w) => ({ name, ...w })));
    expect(found.map((w) => w.name).sort()).toEqual(
      [
        'scheduleAdvance',
        'scheduleDelete',
        'schedulePause',
        'scheduleUpsert',
        'scheduleUpsert',
        'scheduleUpsert',
      ].sort(),
    );
    for (const w of found) {
      expect(w.hints, `${w.name}: ${w.statement}`).toBe(w.joined ? 'ROWLOCK, FORCESEEK' : 'ROWLOCK');
    }
    for (const name of ['scheduleAdvance', 'scheduleUpsert'] as const) {
      expect(queries[name]).toContain(`FROM ${schedules} AS s WITH (ROWLOCK, FORCESEEK)\n`);
    }
  });

  it('upsert: per-id application locks in one order before the update and the insert, never MERGE or a range lock', () => {
    const text = queries.scheduleUpsert;
    expect(text).not.toMatch(/\bMERGE\b|HOLDLOCK|SERIALIZABLE/);
    expect(text).toContain(
      "SELECT DISTINCT N'nestjs-sql-queue:schedule:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'sqlqueue/', i.[Id])), 2) AS [Resource]",
    );
    expect(text).toContain('SELECT ROW_NUMBER() OVER (ORDER BY r.[Resource]), r.[Resource]');
    const begin = text.indexOf('BEGIN TRANSACTION;');
    const lock = text.indexOf(
      "EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction';",
    );
    const update = text.indexOf('UPDATE s');
    const insert = text.indexOf(`INSERT INTO ${schedules} WITH (ROWLOCK)`);
    const prune = text.indexOf('IF @prune IS NOT NULL');
    expect([begin < lock, lock < update, update < insert, insert < prune]).toEqual([true, true, true, true]);
    expect(text).toContain(
      `WHERE NOT EXISTS (SELECT 1 FROM ${schedules} AS e WITH (READCOMMITTEDLOCK) WHERE e.[Id] = i.[Id]);`,
    );
    // The changed-timing rule: NextRunAt moves only when cron or time zone changed; Paused is never set.
    expect(text).toContain(
      '[NextRunAt] = CASE WHEN s.[Cron] <> i.[Cron] OR s.[Timezone] <> i.[Timezone] THEN i.[NextRunAt] ELSE s.[NextRunAt] END',
    );
    expect(text).not.toContain('[Paused] =');
  });

  it('a resume takes the new next run only for a paused schedule', () => {
    expect(queries.schedulePause).toContain(
      'SET [NextRunAt] = CASE WHEN [Paused] = 1 AND @paused = 0 THEN @nextRunAt ELSE [NextRunAt] END',
    );
  });
});
