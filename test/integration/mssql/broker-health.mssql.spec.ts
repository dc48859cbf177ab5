/**
 * The broker health reading's view of the lock manager (review 2, R2-4; issue 21), through the
 * Terminus indicator `broker(key, name)`. A schema-modification lock request on a queue (an ALTER
 * QUEUE, an event notification being changed, Service Broker's poison-message task) waits behind
 * every transaction holding the queue, and every RECEIVE, SEND and read of the queue waits behind
 * it; our receivers hold the queue for a move (milliseconds) or an idle wait, never longer. So:
 * - with another session's transaction holding the queue (it RECEIVEd a message and stays open)
 *   and a third session's ALTER QUEUE … WITH STATUS = ON waiting for Sch-M, health is down naming
 *   the waiter and the holder; once the holder commits the ALTER completes and health is up;
 * - a holder younger than max(30 s, 3 × waitTimeoutMs) is no problem; older, it is reported.
 * Reading sys.dm_tran_locks needs VIEW SERVER STATE: without it both tests skip (the
 * least-privilege test in broker-setup checks what health says then).
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { BROKER_QUEUE_HOLD_MIN_MS } from '../../../lib/src/broker/broker.health.js';
import { quoteBrokerObject } from '../../../lib/src/broker/broker.names.js';
import type { BrokerObjectName } from '../../../lib/src/broker/broker.types.js';
import { enableQueue, receiveAny } from '../../helpers/broker-test-queries.js';
import { beginCallerTransaction, mssqlPoolConfig, type CallerTransaction } from '../../helpers/mssql.js';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, TEST_BROKER, type QueueLockRow } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

/** The bound with the suite's waitTimeoutMs (1 s): max(30 s, 3 × 1 s), the shortest the options allow. */
const HOLD_BOUND_MS = Math.max(BROKER_QUEUE_HOLD_MIN_MS, 3 * TEST_BROKER.waitTimeoutMs!);

const NO_PERMISSION = 'reading sys.dm_tran_locks needs VIEW SERVER STATE, which the test login lacks';

function listing(locks: readonly QueueLockRow[]): string {
  return locks.map((l) => `session ${l.Session}: ${l.Mode} ${l.Status} on the ${l.On}`).join('\n') || '(none)';
}

describeEachMssqlDatabase("Service Broker health: the lock manager's view of a queue", (db) => {
  const suite = brokerSuite(db, 'brkhlt');

  /**
   * A producer-only application for broker queue `name` (it sends and reads health; no receiver
   * takes the message the holder will receive), healthy, with one message waiting.
   */
  async function bootWithOneMessage(name: string) {
    const queue = suite.queue(name).queue;
    const app = await suite.boot({ queues: { [name]: {} }, module: { consumer: { enabled: false } } });
    const calm = await waitFor(
      () => app.health(name),
      (health) => health.status === 'up',
      { what: 'a healthy queue' },
    );
    expect(calm.locks, JSON.stringify(calm)).toMatchObject({
      readable: true,
      schemaLockWaiters: 0,
      holderSession: null,
    });
    await app.producer.send(name, { n: 1 }, { groupKey: 'held' });
    await waitFor(
      () => suite.messagesIn(queue),
      (n) => n === 1,
      { what: 'the message in the target queue' },
    );
    return { app, queue };
  }

  /**
   * Another session's transaction that RECEIVEs the message and stays open. That such a
   * transaction holds a lock on the queue's object until it ends is what a public report shows
   * (an IX lock; dba.stackexchange.com/q/73833, review 2 "facts" item 1), not a documented fact:
   * the assertion says so when it breaks.
   */
  async function holdQueue(queue: BrokerObjectName): Promise<{ holder: CallerTransaction; spid: number }> {
    const holder = await beginCallerTransaction(db.url);
    try {
      const got = await new sql.Request(holder.transaction).query<{ Handle: string }>(receiveAny(queue));
      expect(got.recordset, 'the holder received the message').toHaveLength(1);
      const spid = await holder.spid();
      const locks = await suite.locksOn(queue);
      expect(
        locks.some((l) => l.Session === spid && l.Status === 'GRANT' && l.On === 'queue'),
        `a transaction that RECEIVEd holds a lock on the queue's object (what the health reading looks for); locks seen:\n${listing(locks)}`,
      ).toBe(true);
      return { holder, spid };
    } catch (error) {
      await holder.close();
      throw error;
    }
  }

  it('an ALTER QUEUE waiting for Sch-M behind a transaction holding the queue: health down naming the waiter and the holder; up once the holder commits', async (context) => {
    if (!(await suite.canViewServerState())) context.skip(NO_PERMISSION);
    const name = 'waiter';
    const { app, queue } = await bootWithOneMessage(name);
    const { holder, spid } = await holdQueue(queue);
    // The DDL session: its request must outlive mssql's default 15 s request timeout while it waits.
    const ddl = await new sql.ConnectionPool({ ...mssqlPoolConfig(db.url, 1), requestTimeout: 120_000 }).connect();
    ddl.on('error', () => undefined);
    let altered = false;
    let alter: Promise<void> | null = null;
    try {
      const young = await app.health(name);
      expect(young.status, `a young holder is no problem: ${JSON.stringify(young)}`).toBe('up');
      expect(young.locks).toMatchObject({ readable: true, schemaLockWaiters: 0, holderSession: spid });

      alter = ddl
        .request()
        .batch(enableQueue(queue))
        .then(() => {
          altered = true;
        });
      const seen = await waitFor(
        async () => ({
          waiting: (await suite.locksOn(queue)).filter((l) => l.Mode === 'Sch-M' && l.Status === 'WAIT'),
          altered,
        }),
        (s) => s.waiting.length > 0 || s.altered,
        { what: 'the ALTER QUEUE waiting for a schema-modification lock on the queue' },
      );
      expect(
        seen.altered,
        'ALTER QUEUE … WITH STATUS = ON completed while another transaction held the queue: it took no schema-modification lock (review 2, "facts" item 7)',
      ).toBe(false);
      expect(
        seen.waiting.map((l) => l.On),
        listing(seen.waiting),
      ).toContain('queue');

      const down = await waitFor(
        () => app.health(name),
        (health) => health.status === 'down',
        { what: 'health down while the schema lock waits' },
      );
      // The catalog reading goes first: had it waited behind the Sch-M request, the indicator
      // would report its 2 s timeout instead of the lock reading.
      expect(down.error, 'the health reading itself waited behind the schema lock').toBeUndefined();
      expect(down.problems).toEqual([
        expect.stringContaining(
          `a schema-modification lock waits on queue ${quoteBrokerObject(queue)}, held by session ${spid}`,
        ),
      ]);
      expect(down.locks).toMatchObject({ readable: true, holderSession: spid });
      expect(Number((down.locks as { schemaLockWaiters: unknown }).schemaLockWaiters)).toBeGreaterThanOrEqual(1);

      await holder.commit();
      await alter;
      expect(altered, 'the ALTER QUEUE completed once the holder committed').toBe(true);
    } finally {
      await holder.close();
      await alter?.catch(() => undefined);
      await ddl.close();
    }
    const recovered = await waitFor(
      () => app.health(name),
      (health) => health.status === 'up',
      { what: 'health up again' },
    );
    expect(recovered.locks).toMatchObject({ readable: true, schemaLockWaiters: 0, holderSession: null });
    expect(await suite.queueStatus(queue)).toMatchObject({ ReceiveEnabled: 1, PoisonHandling: 0 });
  });

  // 30 s of waiting: on one database only (the lock manager does not depend on row versioning).
  it.skipIf(db.readCommittedSnapshot)(
    `a transaction holding the queue longer than max(30 s, 3 × waitTimeoutMs) (${HOLD_BOUND_MS} ms here) is reported; younger, it is not`,
    async (context) => {
      if (!(await suite.canViewServerState())) context.skip(NO_PERMISSION);
      const name = 'holder';
      const { app, queue } = await bootWithOneMessage(name);
      // Before the holder's transaction begins: its age on the server is at most the time since.
      const beganBefore = Date.now();
      const { holder, spid } = await holdQueue(queue);
      try {
        const young = await app.health(name);
        expect(young.status, JSON.stringify(young)).toBe('up');
        expect(young.locks).toMatchObject({ readable: true, schemaLockWaiters: 0, holderSession: spid });
        expect(Number((young.locks as { holderAgeMs: unknown }).holderAgeMs)).toBeLessThan(HOLD_BOUND_MS);

        const down = await waitFor(
          () => app.health(name),
          (health) => health.status === 'down',
          { timeoutMs: HOLD_BOUND_MS + 30_000, intervalMs: 1_000, what: 'health down for the old holder' },
        );
        expect(Date.now() - beganBefore, 'reported only past the bound').toBeGreaterThanOrEqual(HOLD_BOUND_MS);
        expect(down.problems).toEqual([
          expect.stringContaining(`queue ${quoteBrokerObject(queue)} has been held by session ${spid}`),
        ]);
        expect((down.problems as string[])[0]).toContain(`limit ${HOLD_BOUND_MS} ms`);
        expect(down.locks).toMatchObject({ readable: true, schemaLockWaiters: 0, holderSession: spid });
        expect(Number((down.locks as { holderAgeMs: unknown }).holderAgeMs)).toBeGreaterThan(HOLD_BOUND_MS);
        await holder.commit();
      } finally {
        await holder.close();
      }
      const recovered = await waitFor(
        () => app.health(name),
        (health) => health.status === 'up',
        { what: 'health up once the holder committed' },
      );
      expect(recovered.locks).toMatchObject({ readable: true, holderSession: null });
    },
    HOLD_BOUND_MS + 60_000,
  );
});
