/**
 * Session state the store does not own (review 2026-12-01, C3, C4, C5; test plan item 9; review
 * 2, R2-6). mssql never resets a pooled connection, so an application sharing its pool
 * (`{ pool }`) can leave IMPLICIT_TRANSACTIONS, ROWCOUNT or an isolation level behind; a caller
 * can pass a SNAPSHOT transaction; a config can ask tedious for local-time dates. The fixed store
 * answers correctly under all of them, or refuses the config before any SQL; so do the Service
 * Broker statements that run on the shared pool (the boot's observation, the listener's poll,
 * the health and lock readings, a send's own transaction, the handler side's jobs).
 */
import sql from 'mssql';
import { describe, expect, it } from 'vitest';
import { SqlQueueConfigError } from '../../../lib/src/core/errors.js';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import type { NewJob } from '../../../lib/src/core/types.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { createQueueStore } from '../../../lib/src/store/create-store.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import {
  beginCallerTransaction,
  mssqlPoolConfig,
  mssqlRows,
  openMssqlPool,
  withErrorNumber,
} from '../../helpers/mssql.js';
import {
  LEAVE_IMPLICIT_TRANSACTIONS,
  LEAVE_ROWCOUNT_1,
  LOCKS_OF_SESSION,
  ROLLBACK_LEFTOVER,
  ROWCOUNT_PROBE,
  SESSION_OF_SPID,
  SESSION_STATE,
  startSnapshot,
  VIEW_SERVER_STATE,
} from '../../helpers/mssql-test-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, CallLog } from './broker-harness.js';
import { describeEachMssqlDatabase, MSSQL_DATABASES, useMssqlSchema } from './mssql-databases.js';

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 5 };
const WORKER = 'session-state';

function job(queue: string, n: number, idempotencyKey?: string): NewJob {
  return prepareJob(queue, { n }, idempotencyKey ? { idempotencyKey } : {}, LIMITS);
}

/** What the shared connection says of itself, from no table (SESSION_STATE). */
interface SessionState {
  Spid: number;
  TranCount: number;
  ImplicitTransactions: number;
}

/** What sys.dm_exec_sessions shows of that session to another connection (SESSION_OF_SPID). */
interface SessionView {
  /** 0 is NORMAL; the store's batches run at LOW and must leave it so. */
  DeadlockPriority: number;
  OpenTransactions: number;
}

describeEachMssqlDatabase('session state the store does not own', (db) => {
  const { schema, store: clean, newQueue, unlocked } = useMssqlSchema(db, 'session');
  /** A schema of its own for the broker queue of the R2-6 test, and its broker objects. */
  const broker = brokerSuite(db, 'sessbrk');

  /**
   * Session `spid` as sys.dm_exec_sessions shows it, read on a connection of its own: a DMV read
   * on the connection left with IMPLICIT_TRANSACTIONS ON may open the transaction the test
   * measures (review 2, R2-2).
   */
  async function sessionView(spid: number): Promise<SessionView> {
    const [row] = await mssqlRows<SessionView>(db.url, SESSION_OF_SPID, (r) => r.input('spid', sql.Int, spid));
    if (!row) {
      throw new Error(
        `sys.dm_exec_sessions shows no session ${spid} to another connection: the login needs VIEW SERVER STATE to read the shared connection's DEADLOCK_PRIORITY`,
      );
    }
    return row;
  }

  it('C3: on a shared one-connection pool left with IMPLICIT_TRANSACTIONS ON and ROWCOUNT 1, claim, heartbeat, complete, fail, release and reap answer correctly and leave no transaction or lock behind', async () => {
    const queue = newQueue('implicit');
    const pool = await openMssqlPool(db.url, 1);
    try {
      // The application's leftovers, as plain batches so they outlive the request.
      await pool.request().batch(LEAVE_ROWCOUNT_1);
      expect((await pool.request().batch(ROWCOUNT_PROBE)).recordset, 'SET ROWCOUNT 1 is in force').toHaveLength(1);
      await pool.request().batch(LEAVE_IMPLICIT_TRANSACTIONS);
      const state = async () => (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      const before = await state();
      expect(before).toMatchObject({ TranCount: 0, ImplicitTransactions: 2 });
      expect(await sessionView(before.Spid)).toEqual({ DeadlockPriority: 0, OpenTransactions: 0 });

      const shared = createMssqlStore({ pool }, { schema });
      const expectNoTransactionAfter = async (operation: string) => {
        const now = await state();
        expect(now.Spid, 'the one pooled connection').toBe(before.Spid);
        expect(now.TranCount, `@@TRANCOUNT on the shared connection after ${operation}`).toBe(0);
      };

      const enqueued = await clean.enqueue(Array.from({ length: 6 }, (_, n) => job(queue, n)));
      const claimed = await withErrorNumber(
        shared.claim({ queue, limit: 6, leaseMs: 60_000, workerId: WORKER }),
        'claim on the shared connection',
      );
      expect(claimed.map((c) => c.id).sort(), 'ROWCOUNT 1 must not cap the claim').toEqual(
        enqueued.map((r) => r.jobId).sort(),
      );
      await expectNoTransactionAfter('claim');

      const owned = claimed.map((c) => ({ id: c.id, claimToken: c.claimToken }));
      const beats = await shared.heartbeat(owned.map((o) => ({ ...o, leaseMs: 60_000, maxDurationMs: null })));
      expect(beats.map((b) => b.outcome)).toEqual(owned.map(() => 'ok'));
      await expectNoTransactionAfter('heartbeat');

      const completed = await shared.complete(owned.slice(0, 2));
      expect(completed.map((c) => c.outcome)).toEqual(['ok', 'ok']);
      await expectNoTransactionAfter('complete');

      const failed = await shared.fail(
        owned.slice(2, 4).map((o) => ({
          ...o,
          error: 'boom',
          stack: null,
          retryDelayMs: 60_000,
          dead: false,
          workerId: WORKER,
        })),
      );
      // A retry 60 s away waits as 'delayed' (schema 4), outside the claim's index.
      expect(failed.map((f) => [f.outcome, f.state])).toEqual([
        ['ok', 'delayed'],
        ['ok', 'delayed'],
      ]);
      await expectNoTransactionAfter('fail');

      const released = await shared.release(owned.slice(4, 6));
      expect(released.map((r) => r.outcome)).toEqual(['ok', 'ok']);
      await expectNoTransactionAfter('release');

      // Two expired leases for the reaper (claimed on the store's own connections).
      const expiring = await clean.claim({ queue, limit: 2, leaseMs: 1, workerId: WORKER });
      expect(expiring).toHaveLength(2);
      await waitFor(
        async () => (await clean.stats(queue)).expiredLeases,
        (n) => n === 2,
        { what: 'two expired leases' },
      );
      const reaped = await shared.reap(100);
      expect(
        reaped.map((r) => r.id),
        'ROWCOUNT 1 must not cap the reaper',
      ).toEqual(expect.arrayContaining(expiring.map((c) => c.id)));
      await expectNoTransactionAfter('reap');

      // Nothing the store did is still locked: the session holds no lock, and every row is readable past locks.
      const [permission] = await mssqlRows<{ Granted: number | null }>(db.url, VIEW_SERVER_STATE);
      if (permission?.Granted === 1) {
        const locks = await mssqlRows<{ ResourceType: string; Mode: string; Object: string | null }>(
          db.url,
          LOCKS_OF_SESSION,
          (r) => r.input('spid', sql.Int, before.Spid),
        );
        expect(locks.map((l) => `${l.Mode} ${l.ResourceType} ${l.Object ?? ''}`)).toEqual([]);
      } else {
        console.warn('session-state: lock check skipped, the login lacks VIEW SERVER STATE');
      }
      expect(await unlocked(queue)).toBe(6);

      // The application's own settings are its own: the store set its options inside its batches.
      expect(await state(), 'IMPLICIT_TRANSACTIONS as the application left it').toMatchObject({
        Spid: before.Spid,
        TranCount: 0,
        ImplicitTransactions: 2,
      });
      expect(await sessionView(before.Spid), 'DEADLOCK_PRIORITY as the application left it').toEqual({
        DeadlockPriority: 0,
        OpenTransactions: 0,
      });
      expect(
        (await pool.request().batch(ROWCOUNT_PROBE)).recordset,
        'ROWCOUNT as the application left it',
      ).toHaveLength(1);
    } finally {
      await pool
        .request()
        .batch(ROLLBACK_LEFTOVER)
        .catch(() => undefined);
      await pool.close();
    }
  });

  it('R2-6: a broker queue consumed on a shared one-connection pool left with IMPLICIT_TRANSACTIONS ON: each message handled once, no transaction left open, health reads fine', async () => {
    const name = 'shared';
    const queues = { [name]: {} };
    // The owner migrates the schema and creates the broker objects, on connections of its own:
    // this test is about the broker's statements on the shared pool, not the boot's DDL.
    const owner = await broker.boot({ queues, module: { consumer: { enabled: false } }, keep: true });
    await owner.close();

    const pool = await openMssqlPool(db.url, 1);
    try {
      await pool.request().batch(LEAVE_IMPLICIT_TRANSACTIONS);
      const state = async () => (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      const before = await state();
      expect(before).toMatchObject({ TranCount: 0, ImplicitTransactions: 2 });
      const expectNoTransactionAfter = async (operation: string) => {
        const now = await state();
        expect(now.Spid, 'the one pooled connection').toBe(before.Spid);
        expect(
          now.TranCount,
          `@@TRANCOUNT on the shared connection after ${operation} (a statement without the autocommit guard opened an implicit transaction; or a transaction begun there nested twice: "When IMPLICIT_TRANSACTIONS = ON an explicit BEGIN TRANSACTION will start two nested transactions", SET IMPLICIT_TRANSACTIONS)`,
        ).toBe(0);
      };

      const log = new CallLog<{ n: number }>();
      const app = await broker.boot({
        queues,
        // migrations 'off': the store's schema-version read is not what this test is about.
        module: { connection: { pool, dialect: 'mssql' }, migrations: 'off' },
        handlers: { [name]: log.handler() },
        keep: true,
      });
      try {
        await expectNoTransactionAfter('the boot (the broker setup observation, the queue settings)');
        const up = await waitFor(
          () => app.health(name),
          (health) => health.status === 'up',
          { what: 'a healthy broker queue on the shared pool' },
        );
        expect(up).toMatchObject({ receiveEnabled: true, consumed: true, listenerAlive: true });
        await expectNoTransactionAfter('the health and lock readings');

        const sent = await withErrorNumber(
          app.producer.send(name, { n: 1 }, { groupKey: 'shared' }),
          'send on the shared connection',
        );
        expect(sent.conversationHandle).not.toBeNull();
        await expectNoTransactionAfter('producer.send (its own transaction on the shared connection)');
        await waitFor(
          () => log.calls.length,
          (n) => n === 1,
          { what: 'the message, handled from the shared pool' },
        );
        const first = log.calls[0]!.context;
        const done = await waitFor(
          () => app.producer.getJob(first.jobId),
          (job) => job?.state === 'done',
          { what: "the message's job done" },
        );
        expect(done!.attempts, 'handled once: its completion was not lost').toBe(1);

        // A second message of the conversation: the first is not run again before it.
        await app.producer.send(name, { n: 2 }, { groupKey: 'shared' });
        await waitFor(
          () => log.calls.length,
          (n) => n >= 2,
          { what: 'the second message' },
        );
        expect(log.handledNs()).toEqual([1, 2]);
        expect(log.calls[1]!.context.conversationHandle).toBe(first.conversationHandle);
        // The activation listener polled the queue (every second) on this connection meanwhile.
        await expectNoTransactionAfter("handling both messages and the listener's polls");

        const again = await app.health(name);
        expect(again.status, JSON.stringify(again)).toBe('up');
        await expectNoTransactionAfter('a second health reading');
      } finally {
        await app.close();
      }

      expect(await state(), 'IMPLICIT_TRANSACTIONS as the application left it').toMatchObject({
        Spid: before.Spid,
        TranCount: 0,
        ImplicitTransactions: 2,
      });
      const [permission] = await mssqlRows<{ Granted: number | null }>(db.url, VIEW_SERVER_STATE);
      if (permission?.Granted === 1) {
        expect(await sessionView(before.Spid), 'the shared session, seen from another connection').toEqual({
          DeadlockPriority: 0,
          OpenTransactions: 0,
        });
        const locks = await mssqlRows<{ ResourceType: string; Mode: string; Object: string | null }>(
          db.url,
          LOCKS_OF_SESSION,
          (r) => r.input('spid', sql.Int, before.Spid),
        );
        expect(locks.map((l) => `${l.Mode} ${l.ResourceType} ${l.Object ?? ''}`)).toEqual([]);
      } else {
        console.warn('session-state R2-6: session and lock checks skipped, the login lacks VIEW SERVER STATE');
      }
    } finally {
      await pool
        .request()
        .batch(ROLLBACK_LEFTOVER)
        .catch(() => undefined);
      await pool.close();
    }
  });

  it.skipIf(!db.snapshotIsolation)(
    'C4: a SNAPSHOT caller transaction enqueueing keys another session committed after its snapshot began gets created: false (not 2601 or 3960)',
    async () => {
      const queue = newQueue('snapshot');
      const caller = await beginCallerTransaction(db.url, sql.ISOLATION_LEVEL.SNAPSHOT);
      try {
        // The snapshot begins at the transaction's first read, not at BEGIN TRANSACTION.
        await new sql.Request(caller.transaction).query(startSnapshot(schema));
        const [one, two] = await clean.enqueue([job(queue, 1, 'snap-1'), job(queue, 2, 'snap-2')]);
        expect([one!.created, two!.created]).toEqual([true, true]);

        const single = await withErrorNumber(
          clean.enqueue([job(queue, 10, 'snap-1')], caller.transaction),
          'enqueueOne of a key committed after the snapshot began',
        );
        expect(single).toEqual([{ jobId: one!.jobId, created: false }]);
        const batch = await withErrorNumber(
          clean.enqueue([job(queue, 20, 'snap-2'), job(queue, 30, 'snap-3')], caller.transaction),
          'enqueueMany with a key committed after the snapshot began',
        );
        expect(batch[0]).toEqual({ jobId: two!.jobId, created: false });
        expect(batch[1]!.created).toBe(true);
        await withErrorNumber(caller.commit(), 'committing the SNAPSHOT transaction');
      } finally {
        await caller.close();
      }
      expect(await unlocked(queue)).toBe(3);
      const again = await clean.enqueue(['snap-1', 'snap-2', 'snap-3'].map((k, n) => job(queue, n, k)));
      expect(again.map((r) => r.created)).toEqual([false, false, false]);
    },
  );
});

// C5 needs no server, only a config, but stays with the SQL Server suite (it names mssql's options).
describe.skipIf(!MSSQL_DATABASES.some((db) => db.url))(
  'C5: a config with useUTC false is refused at store creation',
  () => {
    const url = MSSQL_DATABASES.find((db) => db.url)?.url ?? '';
    const localTime = () => {
      const config = mssqlPoolConfig(url, 1);
      return { ...config, options: { ...config.options, useUTC: false } };
    };
    /** The error `create` fails with; a store it made after all is closed, and the test fails. */
    async function refused(create: () => QueueStore | Promise<QueueStore>): Promise<void> {
      const outcome = await Promise.resolve()
        .then(create)
        .then(
          async (store) => {
            await store.close();
            return null;
          },
          (error: unknown) => error,
        );
      expect(outcome, 'the store was created').toBeInstanceOf(SqlQueueConfigError);
      expect((outcome as Error).message).toMatch(/useUTC/);
    }

    it('as the config the store opens its pool with', async () => {
      await refused(() => createMssqlStore({ config: localTime() }, { schema: 'sqlqueue' }));
      await refused(() => createQueueStore({ dialect: 'mssql', config: localTime() }, { schema: 'sqlqueue' }));
    });

    it("as the config of the application's shared pool", async () => {
      const pool = new sql.ConnectionPool(localTime());
      try {
        await refused(() => createMssqlStore({ pool }, { schema: 'sqlqueue' }));
        await refused(() => createQueueStore({ pool, dialect: 'mssql' }, { schema: 'sqlqueue' }));
      } finally {
        await pool.close();
      }
    });
  },
);
