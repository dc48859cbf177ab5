import sql from 'mssql';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { SqlQueueTransactionError } from '../../lib/src/core/errors.js';
import { prepareJob } from '../../lib/src/core/validation.js';
import { MSSQL_OPEN_TRANSACTION, mssqlQueries } from '../../lib/src/store/mssql/mssql.queries.js';
import { MssqlQueueStore } from '../../lib/src/store/mssql/mssql.store.js';

/** One request the store sent: the statement's name (found by its text) and its bound inputs. */
interface Sent {
  name: string;
  inputs: Record<string, unknown>;
}

type Answer = (sent: Sent) => Record<string, unknown>[];

/**
 * A connected pool whose requests answer from a script, so the store's loops and error mapping
 * can be checked without a server. The SQL itself is checked by the grammar gate and, against
 * a real SQL Server, by the contract suite.
 */
function scriptedStore(answer: Answer): { store: MssqlQueueStore; sent: Sent[] } {
  const byText = new Map(Object.entries(mssqlQueries('sqlqueue')).map(([name, text]) => [text, name]));
  const sent: Sent[] = [];
  const pool = {
    connected: true,
    request() {
      const inputs: Record<string, unknown> = {};
      const request = {
        input(name: string, ...rest: unknown[]) {
          inputs[name] = rest.length === 2 ? rest[1] : rest[0];
          return request;
        },
        async query(text: string) {
          const entry = { name: byText.get(text) ?? 'unknown', inputs };
          sent.push(entry);
          return { recordset: answer(entry) };
        },
      };
      return request;
    },
  };
  return { store: new MssqlQueueStore(pool as unknown as sql.ConnectionPool, false, 'sqlqueue'), sent };
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
    expect(await store.cleanup(request)).toBe(9_500);
    expect(sent.map((s) => s.inputs.batch)).toEqual([4_000, 4_000, 4_000]);
    state.left = 10_000;
    sent.length = 0;
    expect(await store.cleanup({ ...request, batchSize: 5_000 })).toBe(5_000);
    expect(sent.map((s) => s.inputs.batch)).toEqual([4_000, 1_000]);
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
