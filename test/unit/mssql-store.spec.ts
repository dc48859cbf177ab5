import sql from 'mssql';
import { describe, expect, it } from 'vitest';
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
