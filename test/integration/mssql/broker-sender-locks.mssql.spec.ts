/**
 * The sender's locks in a caller's transaction (review 2, R2-3; "Facts only a real server can
 * settle", item 5), on both databases. A send takes its key's application lock and reads the
 * key's dialog row with UPDLOCK alone (lockDialog), so:
 * - a caller transaction that sent the first message of k-1001 and stays open does not hold back
 *   the first send of k-1002 (with UPDLOCK, HOLDLOCK the missing key's range lock covered the gap
 *   up to the next key, where every new rising key lands);
 * - while it is open, its session holds no key-range lock on BrokerDialogs (sys.dm_tran_locks);
 * - two callers opening two new keys each in crossing gaps never deadlock (error 1205).
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { within } from '../../helpers/drills.js';
import { beginCallerTransaction, mssqlRows, withErrorNumber, type CallerTransaction } from '../../helpers/mssql.js';
import { LOCKS_OF_SESSION, VIEW_SERVER_STATE, type SessionLockRow } from '../../helpers/mssql-test-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, CallLog } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

/** Far below the request timeout a send waiting on another caller's transaction would hit. */
const PROMPTLY_MS = 5_000;
/** A send that only waits for its own key's lock (none here): generous for a loaded CI machine. */
const SETTLES_MS = 20_000;

interface Keyed {
  key: string;
}

describeEachMssqlDatabase('Service Broker: a send in an open caller transaction locks its own key only', (db) => {
  const suite = brokerSuite(db, 'brklck');

  /** Boots an application consuming broker queue `name`, recording the keys it handles. */
  async function bootQueue(name: string) {
    const log = new CallLog<Keyed>();
    const { producer } = await suite.boot({ queues: { [name]: {} }, handlers: { [name]: log.handler() } });
    const send = (key: string, transaction?: sql.Transaction) =>
      withErrorNumber(
        producer.send(name, { key }, { groupKey: key, ...(transaction ? { transaction } : {}) }),
        `the send of ${key}${transaction ? ' in a caller transaction' : ''}`,
      );
    const handled = (keys: readonly string[]) =>
      waitFor(
        () => log.bodies().map((b) => b.key),
        (seen) => keys.every((k) => seen.includes(k)),
        { timeoutMs: 30_000, what: `the messages of ${keys.join(', ')}` },
      );
    return { log, send, handled };
  }

  /** What the caller's session holds or waits for in this database, read from another connection by spid. */
  async function locksOf(caller: CallerTransaction): Promise<SessionLockRow[]> {
    const spid = await caller.spid();
    return mssqlRows<SessionLockRow>(db.url, LOCKS_OF_SESSION, (r) => r.input('spid', sql.Int, spid));
  }

  it("the first send of k-1002 does not wait for an open caller transaction that sent k-1001's first message, which holds no key-range lock on BrokerDialogs", async () => {
    const [permission] = await mssqlRows<{ Granted: number | null }>(db.url, VIEW_SERVER_STATE);
    const { log, send, handled } = await bootQueue('gap');
    const t1 = await beginCallerTransaction(db.url);
    const t2 = await beginCallerTransaction(db.url);
    let second: Promise<unknown> | undefined;
    try {
      await send('k-1001', t1.transaction);
      // With rising keys, k-1002 falls in the gap after k-1001: a key-range lock there would make it wait.
      second = send('k-1002', t2.transaction);
      await within(
        second,
        PROMPTLY_MS,
        "T2's first send of k-1002 (it must not wait for T1, whose first send of k-1001 is not committed)",
      );

      if (permission?.Granted === 1) {
        const locks = await locksOf(t1);
        const listing = locks
          .map((l) => `${l.Mode} ${l.Status} ${l.ResourceType} ${l.Object ?? ''}.${l.Index ?? ''} ${l.Resource ?? ''}`)
          .join('\n');
        // Its new dialog row stays X-locked until commit: the listing is of the right session.
        expect(
          locks.some((l) => l.ResourceType === 'KEY' && l.Mode === 'X' && l.Index === 'PK_BrokerDialogs'),
          listing,
        ).toBe(true);
        // The key's application lock (sys.dm_tran_locks shows a resource's first 32 characters).
        expect(
          locks.filter(
            (l) =>
              l.ResourceType === 'APPLICATION' &&
              l.Mode === 'X' &&
              Boolean(l.Resource?.includes('nestjs-sql-queue:dialog:')),
          ),
          listing,
        ).toHaveLength(1);
        // RangeS-U (or any key-range lock) would make first sends of other keys wait for this commit.
        expect(
          locks
            .filter((l) => l.Object === 'BrokerDialogs' && l.Mode.startsWith('Range'))
            .map((l) => `${l.Mode} ${l.Object}.${l.Index} ${l.Resource}`),
          'review 2, R2-3: a key-range lock on BrokerDialogs held by an open caller transaction',
        ).toEqual([]);
      } else {
        console.warn('broker-sender-locks: lock check skipped, the login lacks VIEW SERVER STATE');
      }

      await t2.commit();
      await t1.commit();
    } finally {
      // T1 first: a send of T2 still waiting on it is released by the rollback, then settles.
      await t1.close();
      await second?.catch(() => undefined);
      await t2.close();
    }
    await handled(['k-1001', 'k-1002']);
    expect(log.calls).toHaveLength(2);
  });

  it('two caller transactions opening two new keys each in crossing gaps never deadlock (no error 1205)', async () => {
    const { send, handled } = await bootQueue('crossing');
    const ROUNDS = 5;
    for (let round = 0; round < ROUNDS; round++) {
      // Existing dialogs bound the gaps: k-1 < k-15 < [k-2] < k-3 < k-35 < [k-4]. T1 opens k-1
      // (gap before k-2), then k-3 (gap before k-4); T2 opens k-35 (gap before k-4), then k-15
      // (gap before k-2). Range locks on those gaps, taken in crossing orders, were a deadlock.
      const key = (k: string) => `r${round}-${k}`;
      await send(key('k-2'));
      await send(key('k-4'));
      const [t1, t2] = await Promise.all([beginCallerTransaction(db.url), beginCallerTransaction(db.url)]);
      // Every send of the round, settled before the round ends (a timed-out one is released by the close).
      const pending: Promise<unknown>[] = [];
      const sendIn = (k: string, caller: CallerTransaction) => {
        const sent = send(key(k), caller.transaction);
        pending.push(sent);
        return sent;
      };
      try {
        await within(sendIn('k-1', t1), SETTLES_MS, `round ${round}: T1's first send of ${key('k-1')}`);
        await within(sendIn('k-35', t2), SETTLES_MS, `round ${round}: T2's first send of ${key('k-35')}`);
        const crossing = [sendIn('k-3', t1), sendIn('k-15', t2)];
        const crossed = await within(
          Promise.allSettled(crossing),
          SETTLES_MS,
          `round ${round}: T1's send of ${key('k-3')} and T2's send of ${key('k-15')}`,
        );
        expect(
          // A failure reads "… failed with SQL Server error 1205: …" (withErrorNumber).
          crossed.map((c) => (c.status === 'fulfilled' ? 'ok' : String((c.reason as Error).message))),
          `round ${round}: neither crossing send may fail (1205: the deadlock of review 2, R2-3)`,
        ).toEqual(['ok', 'ok']);
        await t1.commit();
        await t2.commit();
      } finally {
        await Promise.all([t1.close(), t2.close()]);
        await Promise.allSettled(pending);
      }
      await handled(['k-2', 'k-4', 'k-1', 'k-35', 'k-3', 'k-15'].map(key));
    }
  }, 180_000);
});
