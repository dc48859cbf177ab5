/**
 * The claim's and the reaper's table hints on a live server (review 2026-12-01, "Table
 * hints", test plan item 2): they compile and run, and READPAST never raises error 650 —
 * where READ_COMMITTED_SNAPSHOT is on (READPAST then needs READCOMMITTEDLOCK), nor on a pooled
 * connection an application left at SNAPSHOT (READPAST is refused at SNAPSHOT whatever the
 * hints; the store sets READ COMMITTED first). Also settles whether SQL Server takes the
 * four-hint set other SQL Server queues ship (with ROWLOCK), which the store no longer uses.
 * Ordered groups (issue 11; research A (ii) 12): the group claim, settling, the figures and the
 * repair sweep run through the same connections, and what SQL Server does with UPDLOCK and
 * READPAST on a group row without READCOMMITTEDLOCK is recorded.
 * Page locks (review 2, R2-8): READPAST skips row locks, not page locks, and the READPAST
 * statements cannot carry ROWLOCK, so after migrating no index of Jobs, Groups or Schedules may
 * allow page locks (schema version 10), while every one still allows row locks.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { mssqlErrorNumber, mssqlRows, openMssqlPool, withErrorNumber } from '../../helpers/mssql.js';
import {
  claimHintsWithRowlock,
  groupClaimHintsWithoutReadCommittedLock,
  INDEX_LOCK_OPTIONS,
  LEAVE_SNAPSHOT_ISOLATION,
} from '../../helpers/mssql-test-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

const WORKER = 'table-hints';

describeEachMssqlDatabase('claim and reaper table hints', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'hints');

  /** Claims, lets two leases expire, reaps them and reads the figures, all through `on`. */
  async function claimAndReap(on: QueueStore, label: string): Promise<void> {
    const queue = newQueue('hints');
    const jobs = [1, 2, 3].map((n) => prepareJob(queue, { n }, {}, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 }));
    const enqueued = await store.enqueue(jobs);
    expect(await withErrorNumber(on.hasClaimableWork(queue), `${label}: hasClaimableWork`)).toBe(true);
    const short = await withErrorNumber(on.claim({ queue, limit: 2, leaseMs: 1, workerId: WORKER }), `${label}: claim`);
    expect(short).toHaveLength(2);
    await waitFor(
      async () => (await withErrorNumber(on.stats(queue), `${label}: stats`)).expiredLeases,
      (n) => n === 2,
      { what: 'two expired leases' },
    );
    const reaped = await withErrorNumber(on.reap(100), `${label}: reap`);
    expect(reaped.map((r) => r.id)).toEqual(expect.arrayContaining(short.map((c) => c.id)));
    const all = await withErrorNumber(
      on.claim({ queue, limit: 10, leaseMs: 60_000, workerId: WORKER }),
      `${label}: claim`,
    );
    expect(all.map((c) => c.id).sort()).toEqual(enqueued.map((r) => r.jobId).sort());
    const done = await on.complete(all.map((c) => ({ id: c.id, claimToken: c.claimToken })));
    expect(done.map((d) => d.outcome)).toEqual(all.map(() => 'ok'));
  }

  /**
   * The group side of the same calls (issue 11): group claims, a batch reaped with its expired
   * lease, settling, the figures, the blocked-group page and the repair sweep, all through `on`.
   */
  async function groupsClaimAndReap(on: QueueStore, label: string): Promise<void> {
    const queue = newQueue('grouphints');
    const job = (groupKey: string, n: number) =>
      prepareJob(queue, { n }, { groupKey }, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 });
    const enqueued = await store.enqueue([job('g', 1), job('g', 2), job('h', 1)]);
    expect(await withErrorNumber(on.hasClaimableWork(queue), `${label}: hasClaimableWork`)).toBe(true);
    const short = await withErrorNumber(
      on.claim({ queue, limit: 10, groupBatchSize: 2, leaseMs: 1, workerId: WORKER }),
      `${label}: group claim`,
    );
    expect(short.map((c) => c.id).sort()).toEqual(enqueued.map((r) => r.jobId).sort());
    await waitFor(
      async () => (await withErrorNumber(on.stats(queue), `${label}: stats`)).expiredLeases,
      (n) => n === 3,
      { what: 'three expired leases' },
    );
    const reaped = await withErrorNumber(on.reap(100), `${label}: reap`);
    expect(reaped.map((r) => r.id)).toEqual(expect.arrayContaining(short.map((c) => c.id)));
    const all = await withErrorNumber(
      on.claim({ queue, limit: 10, groupBatchSize: 2, leaseMs: 60_000, workerId: WORKER }),
      `${label}: group claim`,
    );
    expect(all).toHaveLength(3);
    const done = await withErrorNumber(
      on.complete(all.map((c) => ({ id: c.id, claimToken: c.claimToken }))),
      `${label}: complete`,
    );
    expect(done.map((d) => d.outcome)).toEqual(all.map(() => 'ok'));
    await withErrorNumber(on.queueHealth({ failureWindowMs: 60_000, repeatedFailures: 3 }), `${label}: queueHealth`);
    expect(await withErrorNumber(on.listBlockedGroups(queue, { limit: 10 }), `${label}: listBlockedGroups`)).toEqual({
      groups: [],
      nextAfterKey: null,
    });
    expect(
      (await withErrorNumber(on.repairGroups(1_000), `${label}: repairGroups`)).filter((r) => r.queue === queue),
    ).toEqual([]);
  }

  it('claim and reap compile and run with their READPAST hints: no error 650', async () => {
    await claimAndReap(store, "the store's own connections");
    await groupsClaimAndReap(store, "the store's own connections");
  });

  it('claim and reap on a shared pool whose connection an application left at SNAPSHOT isolation: no error 650', async () => {
    const pool = await openMssqlPool(db.url, 1);
    try {
      await pool.request().batch(LEAVE_SNAPSHOT_ISOLATION);
      const onSnapshot = createMssqlStore({ pool }, { schema });
      await claimAndReap(onSnapshot, 'a connection left at SNAPSHOT');
      await groupsClaimAndReap(onSnapshot, 'a connection left at SNAPSHOT');
    } finally {
      await pool.close();
    }
  });

  it('R2-8: after migrating, no index of Jobs, Groups or Schedules allows page locks, and each allows row locks (sys.indexes)', async () => {
    const indexes = await mssqlRows<{ Table: string; Index: string; AllowRowLocks: number; AllowPageLocks: number }>(
      db.url,
      INDEX_LOCK_OPTIONS,
      (r) => r.input('schema', sql.NVarChar(128), schema),
    );
    // Named here, not taken from the migrations' list, so that dropping a table from it fails this test.
    for (const table of ['Jobs', 'Groups', 'Schedules']) {
      const ofTable = indexes.filter((i) => i.Table === table);
      expect(ofTable.length, `${table}: its indexes are listed`).toBeGreaterThan(0);
      expect(
        ofTable.map((i) => `${i.Index}: page locks ${i.AllowPageLocks}, row locks ${i.AllowRowLocks}`),
        `review 2, R2-8: ${table}'s indexes after migration (READPAST does not skip page locks)`,
      ).toEqual(ofTable.map((i) => `${i.Index}: page locks 0, row locks 1`));
    }
  });

  it('UPDLOCK, READPAST without READCOMMITTEDLOCK on a group row: accepted where READ_COMMITTED_SNAPSHOT is off; recorded where it is on', async ({
    annotate,
  }) => {
    const outcome = await mssqlRows(db.url, groupClaimHintsWithoutReadCommittedLock(schema), (r) =>
      r.input('queue', sql.NVarChar(128), 'any'),
    ).then(
      () => 'accepted',
      (error: unknown) => `error ${mssqlErrorNumber(error)}: ${(error as Error).message}`,
    );
    await annotate(`UPDLOCK, READPAST (no READCOMMITTEDLOCK) on Groups, SQL Server (${db.label}): ${outcome}`);
    // The table-hints page refuses READPAST under READ_COMMITTED_SNAPSHOT at READ COMMITTED
    // (error 650) unless READCOMMITTEDLOCK is there; whether UPDLOCK lifts that is what this
    // records. The store always sends the three together.
    if (db.readCommittedSnapshot) expect(outcome).toMatch(/^(accepted|error 650:)/);
    else expect(outcome).toBe('accepted');
  });

  it('UPDLOCK, READPAST, READCOMMITTEDLOCK, ROWLOCK together: accepted, or refused as conflicting hints (recorded)', async ({
    annotate,
  }) => {
    const outcome = await mssqlRows(db.url, claimHintsWithRowlock(schema)).then(
      () => 'accepted',
      (error: unknown) => `error ${mssqlErrorNumber(error)}: ${(error as Error).message}`,
    );
    await annotate(`UPDLOCK, READPAST, READCOMMITTEDLOCK, ROWLOCK on SQL Server (${db.label}): ${outcome}`);
    // A refusal names the conflict ("Conflicting locking hints …"); anything else is a test bug.
    expect(outcome).toMatch(/^(accepted|error \d+: .*conflicting)/i);
  });
});
