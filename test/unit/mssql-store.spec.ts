import sql from 'mssql';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { SqlQueueError, SqlQueueTransactionError, SqlQueueValidationError } from '../../lib/src/core/errors.js';
import { DONE_SCAN_LIMIT, THROUGHPUT_RETENTION_MS, type JobState } from '../../lib/src/core/types.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { FLOW_KEYS_AHEAD, FLOW_KEYS_MAX } from '../../lib/src/core/queue-store.js';
import {
  MSSQL_LATEST_VERSION,
  MSSQL_MIGRATIONS,
  mssqlReadVersion,
} from '../../lib/src/store/mssql/mssql.migrations.js';
import {
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_OPEN_TRANSACTION,
  mssqlQueries,
} from '../../lib/src/store/mssql/mssql.queries.js';
import { MssqlQueueStore } from '../../lib/src/store/mssql/mssql.store.js';
import { isLockConflict } from '../../lib/src/store/mssql/mssql.errors.js';

/** One request the store sent: the statement's name (found by its text) and its bound inputs. */
interface Sent {
  name: string;
  inputs: Record<string, unknown>;
}

type Rows = Record<string, unknown>[];

/** A statement's answer: its rows, or (resultSets) each result of a batch that returns several. */
type Answer = (sent: Sent) => Rows | { sets: Rows[] };

const resultSets = (...sets: Rows[]) => ({ sets });

/**
 * A connected pool whose requests answer from a script, so the store's loops and error mapping
 * can be checked without a server. The SQL itself is checked by the grammar gate and, against
 * a real SQL Server, by the contract suite.
 */
function scriptedStore(
  answer: Answer,
  options: { ownsPool?: boolean } = {},
): { store: MssqlQueueStore; sent: Sent[]; texts: string[] } {
  const byText = new Map(Object.entries(mssqlQueries('sqlqueue')).map(([name, text]) => [text, name]));
  const sent: Sent[] = [];
  const texts: string[] = [];
  let closed = false;
  const pool = {
    get connected() {
      return !closed;
    },
    close: async () => {
      closed = true;
    },
    request() {
      const inputs: Record<string, unknown> = {};
      const request = {
        input(name: string, ...rest: unknown[]) {
          inputs[name] = rest.length === 2 ? rest[1] : rest[0];
          return request;
        },
        async query(text: string) {
          texts.push(text);
          const entry = { name: byText.get(text) ?? 'unknown', inputs };
          sent.push(entry);
          const answered = answer(entry);
          const recordsets = Array.isArray(answered) ? [answered] : answered.sets;
          return { recordset: recordsets[0], recordsets };
        },
      };
      return request;
    },
  };
  return {
    store: new MssqlQueueStore(pool as unknown as sql.ConnectionPool, options.ownsPool ?? false, 'sqlqueue'),
    sent,
    texts,
  };
}

function serverError(number: number, message: string): Error {
  return Object.assign(new Error(message), { number });
}

describe('MssqlQueueStore loops over bounded statements (issue 10, P4)', () => {
  it("retryDead('all') walks the dead jobs in keyset batches until one comes back short", async () => {
    const dead = Array.from({ length: 9_000 }, (_, i) => String(i + 1));
    const { store, sent } = scriptedStore(({ inputs }) => {
      const after = Number(inputs.afterId);
      return dead
        .filter((id) => Number(id) > after)
        .slice(0, Number(inputs.batch))
        .map((Id) => ({ Id }));
    });
    const retried = await store.retryDead('mail', 'all');
    expect(retried).toEqual(dead);
    expect(sent.map((s) => [s.name, s.inputs.afterId, s.inputs.batch])).toEqual([
      ['retryAllDead', '0', 4_000],
      ['retryAllDead', '4000', 4_000],
      ['retryAllDead', '8000', 4_000],
    ]);
  });

  /** A store over `rows` deletable rows: each statement deletes up to its @batch of them. */
  function deletingStore(rows: number) {
    const state = { left: rows };
    const scripted = scriptedStore(({ inputs }) => {
      const deleted = Math.min(state.left, Number(inputs.batch));
      state.left -= deleted;
      return [{ Deleted: deleted }];
    });
    return { ...scripted, state };
  }

  it('cleanup splits a large batch into statements of at most 4,000 rows and stops at a short one', async () => {
    const { store, sent, state } = deletingStore(9_500);
    const request = { doneRetentionMs: 1, idempotencyRetentionMs: 1, deadRetentionMs: null, batchSize: 100_000 };
    const jobBatches = () => sent.filter((s) => s.name === 'cleanup').map((s) => s.inputs.batch);
    expect(await store.cleanup(request)).toBe(9_500);
    expect(jobBatches()).toEqual([4_000, 4_000, 4_000]);
    state.left = 10_000;
    sent.length = 0;
    expect(await store.cleanup({ ...request, batchSize: 5_000 })).toBe(5_000);
    expect(jobBatches()).toEqual([4_000, 1_000]);
  });

  it('purgeDead deletes in batches of 4,000', async () => {
    const { store, sent } = deletingStore(4_001);
    expect(await store.purgeDead('mail')).toBe(4_001);
    expect(sent.map((s) => s.inputs.batch)).toEqual([4_000, 4_000]);
  });
});

describe('MssqlQueueStore refuses a connection with an open transaction (issue 10, C3)', () => {
  it.each(['complete', 'stats', 'getJob'] as const)(
    '%s reports the guard as SqlQueueTransactionError',
    async (method) => {
      const { store } = scriptedStore(() => {
        throw serverError(MSSQL_OPEN_TRANSACTION, 'nestjs-sql-queue: … open transaction');
      });
      const call = {
        complete: () => store.complete([{ id: '1', claimToken: '00000000-0000-0000-0000-000000000000' }]),
        stats: () => store.stats('mail'),
        getJob: () => store.getJob('1'),
      }[method];
      const error = await call().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SqlQueueTransactionError);
      expect((error as Error).message).toMatch(new RegExp(`^${method} refused: .*open transaction`));
    },
  );

  it('retries a deadlock victim but not the guard', async () => {
    let calls = 0;
    const { store } = scriptedStore(() => {
      calls++;
      if (calls === 1) throw serverError(1205, 'deadlock victim');
      return [{ HasWork: true }];
    });
    expect(await store.hasClaimableWork('mail')).toBe(true);
    expect(calls).toBe(2);
  });

  it('retries error 601 (a NOLOCK scan lost its place) as a deadlock is retried (review 2, R2-7)', async () => {
    let calls = 0;
    const { store } = scriptedStore(() => {
      calls++;
      if (calls === 1) throw serverError(601, 'Could not continue scan with NOLOCK due to data movement.');
      return [{ Id: '1', Outcome: 'ok' }];
    });
    expect(await store.complete([{ id: '1', claimToken: '00000000-0000-0000-0000-000000000000' }])).toEqual([
      { id: '1', outcome: 'ok' },
    ]);
    expect(calls).toBe(2);
    expect(isLockConflict(serverError(601, 'scan'))).toBe(true);
  });
});

describe('MssqlQueueStore reads the schema version in autocommit with the session guard (review 2, R2-6)', () => {
  it("migrate('check') sends one guarded query through sp_executesql, never a plain batch", async () => {
    const { store, texts } = scriptedStore(() => [{ Version: MSSQL_LATEST_VERSION }]);
    expect(await store.migrate('check')).toEqual({ current: MSSQL_LATEST_VERSION, latest: MSSQL_LATEST_VERSION });
    // IMPLICIT_TRANSACTIONS OFF before the SELECT: a pooled connection left with it on would
    // otherwise keep a transaction open after the read. The scripted pool has no batch().
    expect(texts).toEqual([`${MSSQL_AUTOCOMMIT_SESSION}${mssqlReadVersion('sqlqueue')}`]);
    expect(MSSQL_AUTOCOMMIT_SESSION).toContain('SET IMPLICIT_TRANSACTIONS OFF;');
  });
});

describe('MssqlQueueStore keyed enqueue in autocommit (issue 10, C4)', () => {
  const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };
  const keyed = (key: string | undefined) => prepareJob('mail', {}, key ? { idempotencyKey: key } : {}, LIMITS);

  it('runs the statement again after a duplicate-key error: the other writer committed the key', async () => {
    const { store, sent } = scriptedStore(() => {
      if (sent.length === 1) throw serverError(2601, 'Cannot insert duplicate key row');
      return [{ Id: '42', Created: false }];
    });
    expect(await store.enqueue([keyed('order-1')])).toEqual([{ jobId: '42', created: false }]);
    expect(sent.map((s) => [s.name, s.inputs.inTransaction])).toEqual([
      ['enqueueOne', false],
      ['enqueueOne', false],
    ]);
  });

  it('gives up after three rounds, and never retries a duplicate key without an idempotency key', async () => {
    const duplicate = () => {
      throw serverError(2627, 'Violation of PRIMARY KEY constraint');
    };
    const keyedStore = scriptedStore(duplicate);
    await expect(keyedStore.store.enqueue([keyed('a'), keyed('b')])).rejects.toThrow(/Violation of PRIMARY KEY/);
    expect(keyedStore.sent.map((s) => s.name)).toEqual(['enqueueMany', 'enqueueMany', 'enqueueMany']);
    const plain = scriptedStore(duplicate);
    await expect(plain.store.enqueue([keyed(undefined)])).rejects.toThrow(/Violation/);
    expect(plain.sent).toHaveLength(1);
  });

  it('retries a refused key lock (timeout or deadlock victim) as a lock conflict', async () => {
    const { store, sent } = scriptedStore(() => {
      if (sent.length === 1) throw serverError(51003, 'idempotency key lock not granted (sp_getapplock returned -3)');
      return [
        { Ord: 0, Id: '7', Created: true },
        { Ord: 1, Id: '7', Created: false },
      ];
    });
    expect(await store.enqueue([keyed('k'), keyed('k')])).toEqual([
      { jobId: '7', created: true },
      { jobId: '7', created: false },
    ]);
    expect(sent).toHaveLength(2);
  });
});

describe('MssqlQueueStore ordered groups (issue 11)', () => {
  const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };
  const plain = () => prepareJob('mail', {}, {}, LIMITS);
  const grouped = (groupKey = 'order-1') => prepareJob('mail', {}, { groupKey }, LIMITS);

  afterEach(() => {
    vi.useRealTimers();
  });

  it('sends the grouped enqueue statements only when a job has a group key (ungrouped ones keep theirs)', async () => {
    const { store, sent } = scriptedStore(({ name }) =>
      name.startsWith('enqueueOne')
        ? [{ Id: '1', Created: true }]
        : [
            { Ord: 0, Id: '1', Created: true },
            { Ord: 1, Id: '2', Created: true },
          ],
    );
    await store.enqueue([plain()]);
    await store.enqueue([grouped()]);
    await store.enqueue([plain(), grouped()]);
    await store.enqueue([plain(), plain()]);
    expect(sent.map((s) => s.name)).toEqual(['enqueueOne', 'enqueueOneGrouped', 'enqueueManyGrouped', 'enqueueMany']);
    expect(sent[1]!.inputs.groupKey).toBe('order-1');
  });

  it('runs a grouped enqueue again after a duplicate key in autocommit (a writer that does not take the group lock)', async () => {
    const { store, sent } = scriptedStore(() => {
      if (sent.length === 1) throw serverError(2627, "Violation of PRIMARY KEY constraint 'PK_Groups'");
      return [{ Id: '5', Created: true }];
    });
    expect(await store.enqueue([grouped()])).toEqual([{ jobId: '5', created: true }]);
    expect(sent.map((s) => s.name)).toEqual(['enqueueOneGrouped', 'enqueueOneGrouped']);
  });

  it('binds the group batch size of a claim and the groupOnDead of a queue setting', async () => {
    const { store, sent } = scriptedStore(() => []);
    await store.claim({ queue: 'mail', limit: 4, groupBatchSize: 25, leaseMs: 1000, workerId: 'w' });
    await store.recordQueueSettings([{ queue: 'mail', maxAttempts: 3, groupOnDead: 'block' }]);
    expect(sent.map((s) => [s.name, s.inputs.limit, s.inputs.groupBatchSize, s.inputs.groupOnDead])).toEqual([
      ['claim', 4, 25, undefined],
      ['recordQueueSetting', undefined, undefined, 'block'],
    ]);
  });

  it('pages blocked groups by key: a next key only after a full page', async () => {
    const rows = ['a', 'b', 'c'].map((key, i) => ({
      GroupKey: key,
      JobId: String(i + 1),
      LastError: 'boom',
      FinishedAt: new Date(0),
    }));
    const { store, sent } = scriptedStore(({ inputs }) =>
      rows.filter((r) => r.GroupKey > String(inputs.afterKey ?? '')).slice(0, Number(inputs.limit)),
    );
    const first = await store.listBlockedGroups('mail', { limit: 2 });
    expect(first.groups.map((g) => [g.groupKey, g.jobId, g.error])).toEqual([
      ['a', '1', 'boom'],
      ['b', '2', 'boom'],
    ]);
    expect(first.nextAfterKey).toBe('b');
    const second = await store.listBlockedGroups('mail', { limit: 2, afterKey: first.nextAfterKey });
    expect(second).toEqual({
      groups: [{ groupKey: 'c', jobId: '3', error: 'boom', diedAt: new Date(0) }],
      nextAfterKey: null,
    });
    expect(sent.map((s) => s.inputs.afterKey)).toEqual([null, 'b']);
  });

  const cursors = (rows: string | null, orphans: string | null) => [
    { Kind: 'rows', Queue: rows && 'mail', GroupKey: rows, Version: null, Problem: null },
    { Kind: 'orphans', Queue: orphans && 'mail', GroupKey: orphans, Version: null, Problem: null },
  ];

  it('repairGroups with nothing found sends one statement, and resumes from the cursors it returned', async () => {
    const { store, sent } = scriptedStore(({ name }) => (name === 'findGroupProblems' ? cursors('g-9', null) : []));
    expect(await store.repairGroups(100)).toEqual([]);
    expect(await store.repairGroups(100)).toEqual([]);
    expect(sent.map((s) => [s.name, s.inputs.rowQueue, s.inputs.rowKey, s.inputs.orphanKey, s.inputs.limit])).toEqual([
      ['findGroupProblems', null, null, null, 100],
      ['findGroupProblems', 'mail', 'g-9', null, 100],
    ]);
  });

  it('repairGroups looks again at what it found, a moment later, and reports only what it fixed', async () => {
    vi.useFakeTimers();
    const { store, sent } = scriptedStore(({ name, inputs }) => {
      if (name === 'findGroupProblems')
        return [
          {
            Kind: 'row',
            Queue: 'mail',
            GroupKey: 'a',
            Version: '77',
            Problem: 'head 3 is not the first unfinished job 2',
          },
          { Kind: 'row', Queue: 'mail', GroupKey: 'b', Version: '78', Problem: 'held by token x' },
          { Kind: 'orphan', Queue: 'mail', GroupKey: 'c', Version: null, Problem: 'unfinished jobs but no group row' },
          ...cursors(null, null),
        ];
      // b changed in between (a transition was under way): not fixed, not reported.
      const fixed: Record<string, string | null> = {
        a: 'head 3 is not the first unfinished job 2',
        b: null,
        c: 'unfinished jobs but no group row; created it with head 9',
      };
      return [{ Problem: fixed[String(inputs.groupKey)] }];
    });
    const repairing = store.repairGroups(10);
    await vi.advanceTimersByTimeAsync(0);
    expect(sent.map((s) => s.name)).toEqual(['findGroupProblems']);
    await vi.advanceTimersByTimeAsync(250);
    expect(await repairing).toEqual([
      { queue: 'mail', groupKey: 'a', problem: 'head 3 is not the first unfinished job 2' },
      { queue: 'mail', groupKey: 'c', problem: 'unfinished jobs but no group row; created it with head 9' },
    ]);
    expect(sent.slice(1).map((s) => [s.name, s.inputs.groupKey, s.inputs.version])).toEqual([
      ['repairGroup', 'a', '77'],
      ['repairGroup', 'b', '78'],
      ['repairGroup', 'c', null],
    ]);
  });

  it('stats and queue health report blocked groups', async () => {
    const figures = {
      Ready: '1',
      Delayed: '0',
      Leased: '0',
      ExpiredLeases: '0',
      Dead: '1',
      Retrying: '0',
      BlockedGroups: '1',
      OldestReadyAgeMs: '5',
    };
    const { store } = scriptedStore(({ name }) =>
      name === 'stats'
        ? [figures]
        : [{ ...figures, Queue: 'mail', RecentFailures: '1', RecentLeaseExpiries: '0', RepeatedlyFailing: '0' }],
    );
    expect((await store.stats('mail')).blockedGroups).toBe(1);
    const [health] = await store.queueHealth({ failureWindowMs: 1000, repeatedFailures: 3 });
    expect(health!.blockedGroups).toBe(1);
  });
});

// ---- the dashboard (browsing jobs, throughput) ----

const at = (iso: string) => new Date(iso);

/** A row of a listing's last result: its @page keys and (Found) the job. */
function listed(
  id: number,
  keys: { part?: number; int?: number; at?: string; text?: string; scanEnd?: true },
  found = true,
) {
  return {
    Part: keys.part ?? 1,
    KeyInt: keys.int ?? null,
    KeyAt: keys.at ? at(keys.at) : null,
    KeyText: keys.text ?? null,
    ScanEnd: keys.scanEnd ?? false,
    Id: String(id),
    Found: found,
    Queue: found ? 'mail' : null,
    State: found ? 'ready' : null,
    Priority: found ? (keys.int ?? 0) : null,
    RunAt: found ? at('2026-01-01T00:00:00.000Z') : null,
    GroupKey: found ? (keys.text ?? null) : null,
    IdempotencyKey: null,
    Attempts: found ? 1 : null,
    MaxAttempts: found ? 3 : null,
    LeaseUntil: null,
    WorkerId: null,
    CreatedAt: found ? at('2026-01-01T00:00:00.000Z') : null,
    ClaimedAt: null,
    FinishedAt: null,
    PayloadPreview: found ? `{"n":${id}}` : null,
    LastErrorPreview: null,
  };
}

describe('MssqlQueueStore.listJobs', () => {
  it('binds a first page as no position, and the page after it as the last listed row’s sort key', async () => {
    const { store, sent } = scriptedStore(({ inputs }) =>
      inputs.part === null
        ? [
            listed(7, { int: 5, at: '2026-01-01T00:00:00.123Z' }),
            listed(8, { int: 0, at: '2026-01-01T00:00:01.000Z' }),
            listed(9, { int: 0, at: '2026-01-01T00:00:02.000Z' }),
          ]
        : [listed(9, { int: 0, at: '2026-01-01T00:00:02.000Z' })],
    );
    const first = await store.listJobs({ queue: 'mail', state: 'ready', limit: 2 });
    expect(first.jobs.map((j) => j.id)).toEqual(['7', '8']);
    expect(first.jobs[0]).toMatchObject({
      queue: 'mail',
      state: 'ready',
      priority: 5,
      attempts: 1,
      maxAttempts: 3,
      payloadPreview: '{"n":7}',
      lastErrorPreview: null,
    });
    expect(first.scanLimited).toBe(false);
    expect(sent[0]).toEqual({
      name: 'listReadyJobs',
      inputs: { queue: 'mail', limit: 2, part: null, keyInt: null, keyAt: null, keyText: null, keyId: null },
    });

    const second = await store.listJobs({ queue: 'mail', state: 'ready', limit: 2, cursor: first.nextCursor });
    expect(sent[1]!.inputs).toEqual({
      queue: 'mail',
      limit: 2,
      part: 1,
      keyInt: 0,
      keyAt: at('2026-01-01T00:00:01.000Z'),
      keyText: null,
      keyId: '8',
    });
    expect(second).toEqual({ jobs: [expect.objectContaining({ id: '9' })], nextCursor: null, scanLimited: false });
  });

  it('a position in the grouped part carries the group key, and pages only that part', async () => {
    const { store, sent } = scriptedStore(() => [
      listed(3, { part: 2, text: 'order-1' }),
      listed(4, { part: 2, text: 'order-2' }),
    ]);
    const first = await store.listJobs({ queue: 'mail', state: 'delayed', limit: 1 });
    await store.listJobs({ queue: 'mail', state: 'delayed', limit: 1, cursor: first.nextCursor });
    expect(sent.map((s) => s.name)).toEqual(['listDelayedJobs', 'listDelayedJobs']);
    expect(sent[1]!.inputs).toMatchObject({ part: 2, keyInt: null, keyAt: null, keyText: 'order-1', keyId: '3' });
  });

  it.each<[string, ReturnType<typeof listed>[], string[], string | null]>([
    [
      'a short page: the next starts after the last entry read, not in the state',
      [listed(3, { part: 2, text: 'a' }), listed(9, { part: 2, text: 'b', scanEnd: true }, false)],
      ['3'],
      '9',
    ],
    ['an empty page that still leads on', [listed(9, { part: 2, text: 'b', scanEnd: true }, false)], [], '9'],
    [
      'the last entry read in the state: listed, and the next page starts after it',
      [listed(3, { part: 2, text: 'a' }), listed(9, { part: 2, text: 'b', scanEnd: true })],
      ['3', '9'],
      '9',
    ],
    [
      'a full page and the last entry read past it: nothing between to list, the next starts after it',
      [
        listed(3, { part: 2, text: 'a' }),
        listed(4, { part: 2, text: 'a' }),
        listed(4000, { part: 2, text: 'b', scanEnd: true }, false),
      ],
      ['3', '4'],
      '4000',
    ],
    [
      'a full page and a job past it, the last entry read: the next page lists that job',
      [
        listed(3, { part: 2, text: 'a' }),
        listed(4, { part: 2, text: 'a' }),
        listed(4000, { part: 2, text: 'b', scanEnd: true }),
      ],
      ['3', '4'],
      '4',
    ],
    [
      'the grouped part ended before its bound: no next page',
      [listed(3, { part: 2, text: 'a' }), listed(4, { part: 2, text: 'a' })],
      ['3', '4'],
      null,
    ],
  ])('a grouped look-up that reached its bound (ScanEnd): %s', async (_what, rows, ids, nextId) => {
    const { store, sent } = scriptedStore(() => rows);
    const page = await store.listJobs({ queue: 'mail', state: 'delayed', limit: 2 });
    expect(page.jobs.map((j) => j.id)).toEqual(ids);
    if (nextId === null) {
      expect(page.nextCursor).toBeNull();
      return;
    }
    await store.listJobs({ queue: 'mail', state: 'delayed', limit: 2, cursor: page.nextCursor });
    const last = rows.find((row) => row.Id === nextId)!;
    expect(sent[1]!.inputs).toMatchObject({ part: 2, keyText: last.KeyText, keyId: nextId });
  });

  it('leaves out a job that changed state since it was read, but still pages after it', async () => {
    const { store, sent } = scriptedStore(() => [
      listed(1, { at: '2026-01-01T00:00:00.000Z' }),
      listed(2, { at: '2026-01-01T00:00:00.000Z' }, false),
      listed(3, { at: '2026-01-01T00:00:00.000Z' }),
    ]);
    const page = await store.listJobs({ queue: 'mail', state: 'leased', limit: 2 });
    expect(page.jobs.map((j) => j.id)).toEqual(['1']);
    await store.listJobs({ queue: 'mail', state: 'leased', limit: 2, cursor: page.nextCursor });
    expect(sent[1]!.inputs).toMatchObject({ part: 1, keyAt: at('2026-01-01T00:00:00.000Z'), keyId: '2' });
  });

  it.each([
    ['a full window and a short page: older done jobs may exist', DONE_SCAN_LIMIT, 1, true],
    ['a window that holds every completion', DONE_SCAN_LIMIT - 1, 1, false],
    ['a next page (the window is not counted then)', 0, 3, false],
  ])('done: scanLimited for %s', async (_what, scanned, rows, limited) => {
    const { store } = scriptedStore(() =>
      resultSets(
        Array.from({ length: rows }, (_, i) => listed(10 - i, { at: `2026-01-01T00:00:0${i}.000Z` })),
        [{ Scanned: String(scanned) }],
      ),
    );
    const page = await store.listJobs({ queue: 'mail', state: 'done', limit: 2 });
    expect(page.scanLimited).toBe(limited);
    expect(page.nextCursor === null).toBe(rows <= 2);
  });

  it('an empty page of done jobs still reports a limited look-up', async () => {
    const { store } = scriptedStore(() => resultSets([], [{ Scanned: String(DONE_SCAN_LIMIT) }]));
    expect(await store.listJobs({ queue: 'mail', state: 'done', limit: 50 })).toEqual({
      jobs: [],
      nextCursor: null,
      scanLimited: true,
    });
  });

  it('drops the first half of a surrogate pair that LEFT cut a preview on', async () => {
    const row = { ...listed(1, {}), PayloadPreview: `"${'x'.repeat(198)}\uD83D`, LastErrorPreview: 'boom \uD83D' };
    const { store } = scriptedStore(() => [row]);
    const [job] = (await store.listJobs({ queue: 'mail', state: 'ready', limit: 5 })).jobs;
    expect(job!.payloadPreview).toBe(`"${'x'.repeat(198)}`);
    expect(job!.lastErrorPreview).toBe('boom ');
  });

  it.each<[string, Record<string, unknown>]>([
    ['a limit of 0', { limit: 0 }],
    ['a limit over 500', { limit: 501 }],
    ['a fractional limit', { limit: 1.5 }],
    ['an unknown state', { state: 'running' }],
    ['an invalid queue name', { queue: 'a b' }],
    ['a cursor that is not one', { cursor: 'not a cursor!' }],
  ])('refuses %s before any SQL', async (_what, change) => {
    const { store, sent } = scriptedStore(() => []);
    const request = { queue: 'mail', state: 'ready' as JobState, limit: 10, ...change };
    await expect(store.listJobs(request as never)).rejects.toThrow(SqlQueueValidationError);
    expect(sent).toEqual([]);
  });

  it('refuses the cursor of another listing', async () => {
    const { store, sent } = scriptedStore(() => [
      listed(1, { at: '2026-01-01T00:00:00.000Z' }),
      listed(2, { at: '2026-01-01T00:00:00.000Z' }),
    ]);
    const { nextCursor } = await store.listJobs({ queue: 'mail', state: 'leased', limit: 1 });
    await expect(store.listJobs({ queue: 'mail', state: 'dead', limit: 1, cursor: nextCursor })).rejects.toThrow(
      /belongs to the listing of 'leased' jobs/,
    );
    expect(sent).toHaveLength(1);
  });
});

describe('MssqlQueueStore throughput', () => {
  it('sends one statement with one row per queue, counts summed, all-zero queues left out', async () => {
    const { store, sent } = scriptedStore(() => []);
    await store.recordThroughput([
      { queue: 'b', completed: 1, failed: 0, dead: 0, busyMs: 40 },
      { queue: 'a', completed: 2, failed: 1, dead: 0 },
      { queue: 'b', completed: 3, failed: 0, dead: 2, busyMs: 60 },
      { queue: 'idle', completed: 0, failed: 0, dead: 0 },
    ]);
    expect(sent.map((s) => s.name)).toEqual(['recordThroughput']);
    const table = sent[0]!.inputs.counts as sql.Table;
    expect(table.path).toBe('[sqlqueue].[ThroughputCountListV2]');
    expect(table.columns.map((c) => c.name)).toEqual(['Queue', 'Completed', 'Failed', 'Dead', 'BusyMs']);
    expect(table.rows).toEqual([
      ['b', 4, 0, 2, 100],
      ['a', 2, 1, 0, 0],
    ]);
  });

  it('sends nothing for no counts, or only zeros', async () => {
    const { store, sent } = scriptedStore(() => []);
    await store.recordThroughput([]);
    await store.recordThroughput([{ queue: 'mail', completed: 0, failed: 0, dead: 0 }]);
    expect(sent).toEqual([]);
  });

  it.each([
    ['a negative count', { queue: 'mail', completed: -1, failed: 0, dead: 0 }],
    ['a fractional count', { queue: 'mail', completed: 0.5, failed: 0, dead: 0 }],
    ['an invalid queue name', { queue: 'no spaces', completed: 1, failed: 0, dead: 0 }],
  ])('refuses %s before any SQL', async (_what, count) => {
    const { store, sent } = scriptedStore(() => []);
    await expect(store.recordThroughput([count])).rejects.toThrow(SqlQueueValidationError);
    expect(sent).toEqual([]);
  });

  it('reads the database clock and the buckets (bigint counts as numbers)', async () => {
    const now = at('2026-01-01T10:00:30.500Z');
    const { store, sent } = scriptedStore(() =>
      resultSets(
        [{ Now: now }],
        [{ Minute: at('2026-01-01T09:59:00.000Z'), Queue: 'mail', Completed: '12', Failed: '1', Dead: '0' }],
      ),
    );
    expect(await store.readThroughput(2)).toEqual({
      now,
      buckets: [{ minute: at('2026-01-01T09:59:00.000Z'), queue: 'mail', completed: 12, failed: 1, dead: 0 }],
    });
    expect(sent).toEqual([{ name: 'readThroughput', inputs: { minutes: 2 } }]);
  });

  it.each([0, 1441, 1.5, Number.NaN])('refuses a window of %s minutes', async (minutes) => {
    const { store, sent } = scriptedStore(() => resultSets([{ Now: new Date() }], []));
    await expect(store.readThroughput(minutes)).rejects.toThrow(/throughput minutes must be an integer from 1 to 1440/);
    expect(sent).toEqual([]);
  });

  it('cleanup deletes old buckets once, after the jobs, bounded like a job batch', async () => {
    const { store, sent } = scriptedStore(() => [{ Deleted: 0 }]);
    await store.cleanup({ doneRetentionMs: 1, idempotencyRetentionMs: 1, deadRetentionMs: null, batchSize: 100_000 });
    await store.cleanup({ doneRetentionMs: 1, idempotencyRetentionMs: 1, deadRetentionMs: null, batchSize: 500 });
    expect(sent.map((s) => [s.name, s.inputs.batch, s.inputs.retentionMs])).toEqual([
      ['cleanup', 4_000, undefined],
      ['cleanupThroughput', 4_000, THROUGHPUT_RETENTION_MS],
      ['cleanupFlowState', 4_000, undefined],
      ['cleanup', 500, undefined],
      ['cleanupThroughput', 500, THROUGHPUT_RETENTION_MS],
      ['cleanupFlowState', 500, undefined],
    ]);
  });
});

describe('MssqlQueueStore.purgeDead with ids', () => {
  it('sends the ids, each once, in statements of at most 4,000, with the age; none for no ids', async () => {
    const { store, sent } = scriptedStore(({ inputs }) => [{ Deleted: (inputs.ids as sql.Table).rows.length }]);
    expect(await store.purgeDead('mail', { ids: [] })).toBe(0);
    expect(sent).toEqual([]);
    const ids = Array.from({ length: 4_500 }, (_, i) => String(i + 1));
    expect(await store.purgeDead('mail', { ids: [...ids, '1', '2'], olderThanMs: 60_000 })).toBe(4_500);
    expect(sent.map((s) => [s.name, s.inputs.queue, s.inputs.olderThanMs, s.inputs.batch])).toEqual([
      ['purgeDeadIds', 'mail', 60_000, 4_000],
      ['purgeDeadIds', 'mail', 60_000, 500],
    ]);
    const sentIds = sent.flatMap((s) => (s.inputs.ids as sql.Table).rows.map((row) => row[0]));
    expect(sentIds).toEqual(ids);
    expect((sent[0]!.inputs.ids as sql.Table).path).toBe('[sqlqueue].[IdList]');
  });

  it('refuses an id that is not one, before any SQL', async () => {
    const { store, sent } = scriptedStore(() => [{ Deleted: 0 }]);
    await expect(store.purgeDead('mail', { ids: ['1', 'DROP TABLE'] })).rejects.toThrow(SqlQueueValidationError);
    expect(sent).toEqual([]);
  });
});

/**
 * The columns of the last CREATE TYPE of `type` in the migrations, as mssql's Table#declare
 * writes a column: what a table-valued parameter must match, column for column ("[Queue]
 * nvarchar (128) not null"; the collation and key are the type's own, not the parameter's).
 */
function typeColumns(type: string): string[] {
  const head = `CREATE TYPE [sqlqueue].[${type}] AS TABLE (`;
  const batch = MSSQL_MIGRATIONS.flatMap((m) => m.batches('sqlqueue'))
    .filter((b) => b.startsWith(head))
    .at(-1)!;
  return batch
    .slice(head.length)
    .split('\n')
    .flatMap((line) => {
      const m = /^\s*(\[\w+\]) (\w+)(?:\((\d+)\))?(?: COLLATE \w+)? (NOT NULL|NULL)\b/.exec(line);
      return m ? [`${m[1]} ${m[2]}${m[3] ? ` (${m[3]})` : ''} ${m[4]!.toLowerCase()}`] : [];
    });
}

/** The columns of a bound table, in mssql's declaration form (Table#declare, missing from its types). */
function boundColumns(table: sql.Table): string[] {
  const declared = (table as unknown as { declare(): string }).declare();
  return /^create table \S+ \((.*)\)$/.exec(declared)![1]!.split(', ');
}

describe('the table-valued parameters of the dashboard statements match their types', () => {
  it('recordThroughput binds ThroughputCountListV2 column for column: name, type, length, nullability', async () => {
    const { store, sent } = scriptedStore(() => []);
    await store.recordThroughput([{ queue: 'mail', completed: 1, failed: 2, dead: 3 }]);
    const columns = typeColumns('ThroughputCountListV2');
    expect(columns).toEqual([
      '[Queue] nvarchar (128) not null',
      '[Completed] bigint not null',
      '[Failed] bigint not null',
      '[Dead] bigint not null',
      '[BusyMs] bigint not null',
    ]);
    expect(boundColumns(sent[0]!.inputs.counts as sql.Table)).toEqual(columns);
  });

  it('purgeDead with ids binds IdList column for column', async () => {
    const { store, sent } = scriptedStore(() => [{ Deleted: 1 }]);
    await store.purgeDead('mail', { ids: ['1'] });
    expect(typeColumns('IdList')).toEqual(['[Id] bigint not null']);
    expect(boundColumns(sent[0]!.inputs.ids as sql.Table)).toEqual(typeColumns('IdList'));
  });
});

describe('MssqlQueueStore.close', () => {
  it('a store that opened its pool refuses work once closed, instead of opening the pool again', async () => {
    const { store, sent } = scriptedStore(() => [], { ownsPool: true });
    await store.close();
    await expect(store.recordThroughput([{ queue: 'mail', completed: 1, failed: 0, dead: 0 }])).rejects.toThrow(
      SqlQueueError,
    );
    await expect(store.ping(1_000)).rejects.toThrow(/store of schema 'sqlqueue' is closed/);
    expect(sent).toEqual([]);
  });
});

describe('MssqlQueueStore: flow control (issue 24)', () => {
  const claimedRow = (id: string, key: string | null) => ({
    Id: id,
    Queue: 'tenants',
    Payload: '{}',
    Priority: 0,
    GroupKey: null,
    IdempotencyKey: null,
    Attempts: 1,
    MaxAttempts: 3,
    ClaimToken: 'AAAAAAAA-0000-0000-0000-000000000001',
    CreatedAt: new Date(0),
    ClaimedAt: new Date(0),
    LeaseUntil: new Date(30_000),
    TraceContext: null,
    ConcurrencyKey: key,
  });
  const request = { queue: 'tenants', limit: 5, leaseMs: 30_000, workerId: 'w' };

  it('binds the concurrency key of an enqueue and the limits a consumer records', async () => {
    const { store, sent } = scriptedStore(({ name }) => (name === 'enqueueOne' ? [{ Id: '1', Created: true }] : []));
    const keyed = prepareJob(
      'tenants',
      {},
      { concurrencyKey: 'acme' },
      { maxPayloadBytes: 1024, defaultMaxAttempts: 3 },
    );
    await store.enqueue([keyed]);
    expect(sent[0]).toMatchObject({ name: 'enqueueOne', inputs: { concurrencyKey: 'acme', groupKey: null } });
    const limits = {
      globalConcurrency: 2,
      concurrencyPerKey: 1,
      rateLimit: { max: 50, perMs: 1000 },
      rateLimitPerKey: null,
    };
    await store.recordQueueSettings([{ queue: 'tenants', maxAttempts: 3, groupOnDead: 'continue', limits }]);
    expect(sent[1]).toMatchObject({
      name: 'recordQueueSetting',
      inputs: {
        globalConcurrency: 2,
        concurrencyPerKey: 1,
        rateMax: 50,
        ratePerMs: 1000,
        keyRateMax: null,
        keyRatePerMs: null,
      },
    });
  });

  it('hands a queue to the flow claim when the ordinary claim says so, for the rest of the limit and from then on', async () => {
    const { store, sent } = scriptedStore(({ name, inputs }) =>
      name === 'flowClaim'
        ? resultSets([claimedRow('2', 'acme')], [{ Paused: false, RateFreeInMs: null }])
        : inputs.queue === 'tenants'
          ? resultSets([claimedRow('1', null)], [{ FlowClaim: true }])
          : resultSets([]),
    );
    const first = await store.claim(request);
    expect(first.map((job) => job.id)).toEqual(['1', '2']);
    expect(sent.map((s) => [s.name, s.inputs.limit])).toEqual([
      ['claim', 5],
      ['flowClaim', 4],
    ]);
    expect(sent[1]!.inputs).toMatchObject({ keysAhead: FLOW_KEYS_AHEAD, keysMax: FLOW_KEYS_MAX, workerId: 'w' });
    await store.claim(request);
    expect(sent.map((s) => s.name)).toEqual(['claim', 'flowClaim', 'flowClaim']);
    // Another queue still takes the ordinary claim, and without the second result nothing more.
    await store.claim({ ...request, queue: 'other' });
    expect(sent.map((s) => s.name)).toEqual(['claim', 'flowClaim', 'flowClaim', 'claim']);
  });

  it('takes the flow claim at once for limits of its own, and keeps the rate window hint it answers', async () => {
    let freeInMs: number | null = 250;
    const { store, sent } = scriptedStore(() => resultSets([], [{ Paused: false, RateFreeInMs: freeInMs }]));
    expect(await store.claim({ ...request, limited: true })).toEqual([]);
    expect(sent.map((s) => s.name)).toEqual(['flowClaim']);
    const hint = store.claimRetryHintMs('tenants');
    expect(hint).toBeGreaterThan(150);
    expect(hint).toBeLessThanOrEqual(250);
    freeInMs = null;
    await store.claim({ ...request, limited: true });
    expect(store.claimRetryHintMs('tenants')).toBeNull();
  });

  it('reads flow usage: limits, counts and the busiest keys from JSON text, none as an empty list', async () => {
    let keys: string | null = JSON.stringify([{ key: 'acme', running: 2, waiting: 7 }]);
    const { store, sent } = scriptedStore(() => [
      {
        GlobalConcurrency: 5,
        ConcurrencyPerKey: 2,
        RateMax: null,
        RatePerMs: null,
        KeyRateMax: 10,
        KeyRatePerMs: 60_000,
        Running: 3,
        WindowStarts: null,
        KeysAtLimit: 1,
        Keys: keys,
      },
    ]);
    expect(await store.flowUsage('tenants', 10)).toEqual({
      queue: 'tenants',
      limits: {
        globalConcurrency: 5,
        concurrencyPerKey: 2,
        rateLimit: null,
        rateLimitPerKey: { max: 10, perMs: 60_000 },
      },
      running: 3,
      windowStarts: null,
      keysAtLimit: 1,
      keys: [{ key: 'acme', running: 2, waiting: 7 }],
    });
    expect(sent[0]).toMatchObject({ name: 'flowUsage', inputs: { queue: 'tenants', top: 10 } });
    keys = null;
    expect((await store.flowUsage('tenants', 10)).keys).toEqual([]);
  });
});
