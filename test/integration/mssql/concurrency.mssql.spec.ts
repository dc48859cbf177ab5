/**
 * Keyed enqueue under concurrency on SQL Server (review 2026-12-01, C1 and C2; test plan
 * items 4 and 5), on both databases. The fixed behaviour: producers of one key serialize,
 * producers of different keys never wait for each other, whatever order their batches list
 * the keys in and however long a caller keeps its transaction open.
 *
 * The contract suite (store-contract.ts, run on both databases by store-contract.mssql.spec.ts)
 * has the plain cases: autocommit batches in crossing orders, one caller transaction after
 * another, and order-1002 beside an open transaction holding order-1001. Here: two caller
 * transactions racing with crossing batches, a key between two keys a caller's batch holds,
 * and the locks the open transaction's session holds (sys.dm_tran_locks).
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import type { EnqueueResult, NewJob } from '../../../lib/src/core/types.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { within } from '../../helpers/drills.js';
import { beginCallerTransaction, mssqlRows, withErrorNumber } from '../../helpers/mssql.js';
import { LOCKS_OF_SESSION, VIEW_SERVER_STATE, type SessionLockRow } from '../../helpers/mssql-test-queries.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

/** Far below the 15 s request timeout a producer waiting on another's transaction would hit. */
const PROMPTLY_MS = 5_000;

function keyed(queue: string, key: string): NewJob {
  return prepareJob(queue, { key }, { idempotencyKey: key }, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 });
}

describeEachMssqlDatabase('keyed enqueue under concurrency', (db) => {
  const { store, newQueue, unlocked } = useMssqlSchema(db, 'conc', 4);

  it('C1: two caller transactions enqueue the same keys in opposite orders: no deadlock, both commit, one job per key', async () => {
    for (let round = 0; round < 5; round++) {
      const queue = newQueue('crossing');
      const keys = Array.from({ length: 20 }, (_, i) => `k-${String(i).padStart(2, '0')}`);
      const [a, b] = await Promise.all([beginCallerTransaction(db.url), beginCallerTransaction(db.url)]);
      const inA = withErrorNumber(
        store.enqueue(
          keys.map((k) => keyed(queue, k)),
          a.transaction,
        ),
        `round ${round}: enqueueMany of keys ${keys[0]}..${keys[19]} in transaction A`,
      );
      const inB = withErrorNumber(
        store.enqueue(
          [...keys].reverse().map((k) => keyed(queue, k)),
          b.transaction,
        ),
        `round ${round}: enqueueMany of keys ${keys[19]}..${keys[0]} in transaction B`,
      );
      try {
        // Producers of one key serialize: one batch finishes, the other waits for its commit.
        const first = await within(
          Promise.race([inA.then(() => 'A' as const), inB.then(() => 'B' as const)]),
          20_000,
          `round ${round}: either batch to finish`,
        );
        const [firstTx, secondTx, second] = first === 'A' ? [a, b, inB] : [b, a, inA];
        await firstTx.commit();
        await within(second, 20_000, `round ${round}: the other batch, once the first committed`);
        await secondTx.commit();

        const fromA = await inA;
        const fromB = [...(await inB)].reverse();
        keys.forEach((key, i) => {
          expect(fromA[i]!.jobId, `key ${key}: one job for both transactions`).toBe(fromB[i]!.jobId);
          expect([fromA[i]!.created, fromB[i]!.created].filter(Boolean), `key ${key}: created once`).toHaveLength(1);
        });
        expect(await unlocked(queue)).toBe(keys.length);
      } finally {
        await Promise.allSettled([inA, inB]);
        await Promise.all([a.close(), b.close()]);
      }
    }
  });

  it("C2: a producer of a key between two keys a caller's open batch holds does not wait for its commit", async () => {
    const held = ['order-1001', 'order-1003'];
    const queue = newQueue('orders');
    const caller = await beginCallerTransaction(db.url);
    let other: Promise<EnqueueResult[]> | undefined;
    try {
      const mine = await store.enqueue(
        held.map((k) => keyed(queue, k)),
        caller.transaction,
      );
      expect(mine.map((r) => r.created)).toEqual(held.map(() => true));
      // The gap between the held keys: a key-range lock on order-1003 would make it wait.
      other = withErrorNumber(store.enqueue([keyed(queue, 'order-1002')]), 'the second producer');
      const [result] = await within(
        other,
        PROMPTLY_MS,
        "the second producer's enqueue of order-1002 (it must not wait for the open transaction holding order-1001 and order-1003)",
      );
      expect(result!.created).toBe(true);
      await caller.commit();
      const again = await store.enqueue([...held, 'order-1002'].map((k) => keyed(queue, k)));
      expect(again.map((r) => r.created)).toEqual([...held, 'order-1002'].map(() => false));
      expect(await unlocked(queue)).toBe(held.length + 1);
    } finally {
      // A producer still waiting is released by the rollback, then settles.
      await caller.close();
      await other?.catch(() => undefined);
    }
  });

  it('C2: while its transaction is open, the producer holds no key-range lock (sys.dm_tran_locks)', async ({
    skip,
  }) => {
    const [permission] = await mssqlRows<{ Granted: number | null }>(db.url, VIEW_SERVER_STATE);
    if (permission?.Granted !== 1)
      skip('the login lacks VIEW SERVER STATE, so sys.dm_tran_locks shows only its own session');
    const queue = newQueue('locks');
    const caller = await beginCallerTransaction(db.url);
    try {
      await store.enqueue([keyed(queue, 'order-2001')], caller.transaction);
      await store.enqueue([keyed(queue, 'order-2002'), keyed(queue, 'order-2003')], caller.transaction);
      const spid = await caller.spid();
      const locks = await mssqlRows<SessionLockRow>(db.url, LOCKS_OF_SESSION, (r) => r.input('spid', sql.Int, spid));
      const listing = locks.map(
        (l) => `${l.Mode} ${l.ResourceType} ${l.Object ?? ''}.${l.Index ?? ''} ${l.Resource ?? ''}`,
      );
      // Its own inserts stay locked until commit: the listing is of the right session.
      expect(
        locks.some((l) => l.ResourceType === 'KEY' && l.Mode === 'X'),
        listing.join('\n'),
      ).toBe(true);
      // RangeS-U (or any key-range lock) would make other keys of the queue wait for this commit.
      expect(
        locks.filter((l) => l.Mode.startsWith('Range')).map((l) => `${l.Mode} ${l.Object}.${l.Index} ${l.Resource}`),
      ).toEqual([]);
    } finally {
      await caller.close();
    }
  });
});
