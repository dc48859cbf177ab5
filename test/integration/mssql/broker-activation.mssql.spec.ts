/**
 * External activation of Service Broker readers (issue 12, seed 003; research B (ii) 6, 7 and 8),
 * on the database with READ_COMMITTED_SNAPSHOT off (activation does not depend on row versioning;
 * the journal and dialog tables run on both in the other broker files):
 * - a backlog starts readers up to maxReaders (QUEUE_ACTIVATION notifications and the slow poll),
 *   never more; idle readers retire to minReaders, never fewer;
 * - one dialog with 1,000 messages keeps at most one reader busy (one conversation group);
 * - a lost activation event notification turns health down, is recreated and reported, and the
 *   queue keeps being read meanwhile;
 * - closing the application while readers wait in WAITFOR is prompt and loses nothing, and six
 *   such shutdowns leave the queue enabled (an idle reader's transaction is never a poison rollback);
 * - the boot refuses a reader requestTimeoutMs that does not exceed waitTimeoutMs by 5 s.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { SqlQueueConfigError } from '../../../lib/src/index.js';
import {
  dropActivationNotification,
  OPEN_TRANSACTION_REQUESTS_OF_PROCESS,
  OPEN_TRANSACTIONS_OF_PROCESS,
} from '../../helpers/broker-test-queries.js';
import { mssqlRows } from '../../helpers/mssql.js';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, CallLog, outOfOrder, sequencesByConversation, yieldOnce } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

interface Keyed {
  key: string;
  n: number;
}

describeEachMssqlDatabase(
  'Service Broker: external activation starts and retires readers',
  (db) => {
    const suite = brokerSuite(db, 'brkact');

    const sessionsOfThisProcess = async (text: string) => {
      const [row] = await mssqlRows<{ Sessions: number }>(db.url, text, (r) => r.input('pid', sql.Int, process.pid));
      return row!.Sessions;
    };

    it('a backlog starts readers up to maxReaders, never more; idle readers retire to minReaders', async () => {
      const name = 'backlog';
      const DIALOGS = 60;
      const PER_DIALOG = 10;
      // The backlog is queued before any reader exists: Service Broker notifies at once.
      const sender = await suite.boot({ queues: { [name]: {} }, module: { consumer: { enabled: false } } });
      await Promise.all(
        Array.from({ length: DIALOGS }, async (_, d) => {
          for (let n = 0; n < PER_DIALOG; n++) {
            await sender.producer.send(name, { key: `d${d}`, n }, { groupKey: `d${d}` });
          }
        }),
      );
      const log = new CallLog<Keyed>();
      const { events } = await suite.boot({
        queues: { [name]: { minReaders: 1, maxReaders: 4, messagesPerTransaction: 5 } },
        handlers: { [name]: log.handler(() => yieldOnce(20)) },
      });
      await waitFor(
        () => events.peakReaders(name),
        (readers) => readers === 4,
        { timeoutMs: 30_000, what: 'readers up to maxReaders under the backlog' },
      );
      await waitFor(
        () => log.calls.length,
        (n) => n >= DIALOGS * PER_DIALOG,
        { timeoutMs: 60_000, intervalMs: 100, what: 'the backlog drained' },
      );
      // Idle: each reader's WAITFOR comes back empty, and all but minReaders retire.
      await waitFor(
        () => events.readers(name),
        (readers) => readers === 1,
        { timeoutMs: 20_000, what: 'idle readers retired to minReaders' },
      );
      const changes = events.of('brokerReadersChanged', name).filter((e) => e.reason !== 'stop');
      expect(events.peakReaders(name)).toBe(4);
      expect(Math.min(...changes.map((e) => Number(e.readers)))).toBeGreaterThanOrEqual(1);
      expect(changes.some((e) => e.reason === 'retire')).toBe(true);
      expect(events.of('brokerActivated', name).length).toBeGreaterThan(0);
      expect(log.peak).toBeLessThanOrEqual(4);
      expect(log.overlaps).toEqual([]);
      expect(outOfOrder(sequencesByConversation(log.calls))).toEqual([]);
    });

    it('one dialog with 1,000 messages keeps at most one reader busy', async () => {
      const name = 'onedialog';
      const log = new CallLog<Keyed>();
      const app = await suite.boot({
        queues: { [name]: { minReaders: 1, maxReaders: 4 } },
        handlers: { [name]: log.handler() },
      });
      let busiest = 0;
      const watch = setInterval(() => {
        const mine = app.snapshot().queues.find((q) => q.queue === name);
        busiest = Math.max(busiest, mine?.busyReaders ?? 0);
      }, 5);
      try {
        for (let n = 0; n < 1_000; n++) await app.producer.send(name, { key: 'one', n }, { groupKey: 'one' });
        await waitFor(
          () => log.calls.length,
          (n) => n >= 1_000,
          { timeoutMs: 60_000, intervalMs: 100, what: '1,000 messages of one dialog' },
        );
      } finally {
        clearInterval(watch);
      }
      expect(log.peak, 'handlers running at once').toBe(1);
      expect(busiest, 'busy readers').toBeLessThanOrEqual(1);
      expect(log.bodies().map((b) => b.n)).toEqual(Array.from({ length: 1_000 }, (_, n) => n));
    });

    it('a dropped activation event notification: health down, recreated and reported, and the queue is still read', async () => {
      const name = 'lostnote';
      const log = new CallLog<Keyed>();
      const app = await suite.boot({
        queues: { [name]: { minReaders: 1, maxReaders: 2 } },
        broker: { pollIntervalMs: 3_000 },
        handlers: { [name]: log.handler() },
      });
      await waitFor(
        () => app.health(name),
        (health) => health.status === 'up',
        { what: 'a healthy queue' },
      );
      const activation = suite.queue(name).activationNotification;
      expect(await suite.eventNotifications(name)).toContain(activation);

      await mssqlRows(db.url, dropActivationNotification(suite.queue(name).queue));
      const afterDrop = await app.health(name);
      // Down until the slow poll recreates it (unless that already happened, which the event says).
      if (app.events.of('brokerNotificationLost', name).length === 0) {
        expect(afterDrop.status).toBe('down');
        expect(JSON.stringify(afterDrop)).toContain(activation);
      }
      // Sent while it is missing: the running reader (and the poll) still handle it.
      await app.producer.send(name, { key: 'during', n: 0 }, { groupKey: 'during' });
      await waitFor(
        () => suite.eventNotifications(name),
        (names) => names.includes(activation),
        { timeoutMs: 20_000, what: 'the event notification recreated' },
      );
      await waitFor(
        () => app.events.of('brokerNotificationLost', name),
        (lost) => lost.length > 0,
        { what: 'brokerNotificationLost' },
      );
      expect(app.events.of('brokerNotificationLost', name)[0]).toMatchObject({ recreated: true });
      await waitFor(
        () => log.calls.length,
        (n) => n === 1,
        { what: 'the message sent while the notification was missing' },
      );
      await waitFor(
        () => app.health(name),
        (health) => health.status === 'up',
        { timeoutMs: 20_000, what: 'health up again' },
      );
      expect(app.events.readers(name)).toBeGreaterThanOrEqual(1);
    });

    it('closing the application while readers wait in WAITFOR is prompt and loses nothing; six times leaves the queue enabled', async () => {
      const name = 'shutdown';
      // A long WAITFOR: a close that waited it out would take 20 s.
      const broker = { waitTimeoutMs: 20_000, requestTimeoutMs: 40_000 };
      const queues = { [name]: { minReaders: 2, maxReaders: 2 } };
      const log = new CallLog<Keyed>();
      for (let round = 0; round < 6; round++) {
        const app = await suite.boot({ queues, broker, handlers: { [name]: log.handler() }, keep: true });
        try {
          await app.producer.send(name, { key: 'k', n: round }, { groupKey: 'k' });
          await waitFor(
            () => log.calls.length,
            (n) => n === round + 1,
            { what: `message ${round}` },
          );
          // Both readers back in their WAITFOR: a request running inside an open transaction.
          await waitFor(
            () => sessionsOfThisProcess(OPEN_TRANSACTION_REQUESTS_OF_PROCESS),
            (sessions) => sessions >= 2,
            { what: 'readers waiting in WAITFOR' },
          );
        } finally {
          const started = Date.now();
          await app.close();
          expect(Date.now() - started, `round ${round}: close took`).toBeLessThan(10_000);
        }
        expect(await sessionsOfThisProcess(OPEN_TRANSACTIONS_OF_PROCESS), 'transactions left open').toBe(0);
      }
      // Sent while no reader runs: the next application gets it.
      const sender = await suite.boot({ queues, broker, module: { consumer: { enabled: false } } });
      await sender.producer.send(name, { key: 'k', n: 6 }, { groupKey: 'k' });
      await sender.close();
      await suite.boot({ queues, handlers: { [name]: log.handler() } });
      await waitFor(
        () => log.calls.length,
        (n) => n === 7,
        { what: 'the message sent between applications' },
      );
      expect(log.bodies().map((b) => b.n)).toEqual([0, 1, 2, 3, 4, 5, 6]);
      expect(await suite.receiveEnabled(name)).toBe(1);
    });

    it('the boot refuses a requestTimeoutMs that does not exceed waitTimeoutMs by 5 s, before connecting', async () => {
      const started = Date.now();
      const boot = suite.boot({
        queues: { refused: {} },
        broker: { waitTimeoutMs: 5_000, requestTimeoutMs: 10_000 },
        handlers: { refused: () => Promise.resolve() },
      });
      await expect(boot).rejects.toThrow(SqlQueueConfigError);
      await expect(boot).rejects.toThrow(/requestTimeoutMs \(10000\) must exceed broker\.waitTimeoutMs \(5000\)/);
      expect(Date.now() - started).toBeLessThan(5_000);
    });
  },
  (db) => db.label === 'RCSI off',
);
