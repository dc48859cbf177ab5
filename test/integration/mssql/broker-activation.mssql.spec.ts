/**
 * External activation of Service Broker receivers (issue 12, seed 003; issue 21's receivers that
 * move messages into the table queue), on the database with READ_COMMITTED_SNAPSHOT off
 * (activation does not depend on row versioning; the table-queue side runs on both in the other
 * broker files):
 * - a backlog starts receivers up to maxReceivers (QUEUE_ACTIVATION notifications and the slow
 *   poll), never more; idle receivers retire to minReceivers, never fewer; the handlers (the
 *   table queue's readers, up to maxReaders) never overlap within a conversation;
 * - one dialog with 1,000 messages: one ordered group, so at most one handler of it runs at a
 *   time (the table queue's busy count), in sequence order;
 * - a lost activation event notification turns health down, is recreated and reported, and the
 *   queue keeps being read meanwhile;
 * - closing the application while receivers wait in WAITFOR is prompt and loses nothing, and six
 *   such shutdowns leave the queue enabled (a receiver waits in autocommit: no transaction to roll back);
 * - the boot refuses a reader requestTimeoutMs that does not exceed waitTimeoutMs by 5 s.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { SqlQueueConfigError } from '../../../lib/src/index.js';
import {
  dropActivationNotification,
  OPEN_TRANSACTIONS_OF_PROCESS,
  REQUESTS_OF_PROCESS,
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
  'Service Broker: external activation starts and retires receivers',
  (db) => {
    const suite = brokerSuite(db, 'brkact');

    const sessionsOfThisProcess = async (text: string) => {
      const [row] = await mssqlRows<{ Sessions: number }>(db.url, text, (r) => r.input('pid', sql.Int, process.pid));
      return row!.Sessions;
    };

    it('a backlog starts receivers up to maxReceivers, never more; idle receivers retire to minReceivers; handlers stay in order per conversation', async () => {
      const name = 'backlog';
      const DIALOGS = 60;
      const PER_DIALOG = 20;
      // The backlog is queued before any receiver exists: Service Broker notifies at once.
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
        // One message per move: moving the backlog takes long enough for activation to add receivers.
        queues: {
          [name]: { minReceivers: 1, maxReceivers: 4, messagesPerTransaction: 1, minReaders: 1, maxReaders: 4 },
        },
        handlers: { [name]: log.handler(() => yieldOnce(5)) },
      });
      await waitFor(
        () => events.peakReceivers(name),
        (receivers) => receivers === 4,
        { timeoutMs: 30_000, what: 'receivers up to maxReceivers under the backlog' },
      );
      await waitFor(
        () => log.calls.length,
        (n) => n >= DIALOGS * PER_DIALOG,
        { timeoutMs: 90_000, intervalMs: 100, what: 'the backlog handled' },
      );
      // Idle: each receiver's WAITFOR comes back empty, and all but minReceivers retire.
      await waitFor(
        () => events.receivers(name),
        (receivers) => receivers === 1,
        { timeoutMs: 20_000, what: 'idle receivers retired to minReceivers' },
      );
      const changes = events.of('brokerReceiversChanged', name).filter((e) => e.reason !== 'stop');
      expect(events.peakReceivers(name)).toBe(4);
      expect(Math.min(...changes.map((e) => Number(e.receivers)))).toBeGreaterThanOrEqual(1);
      expect(changes.some((e) => e.reason === 'retire')).toBe(true);
      expect(events.of('brokerActivated', name).length).toBeGreaterThan(0);
      // Every message moved once, and handled once.
      expect(events.moved(name)).toBe(DIALOGS * PER_DIALOG);
      expect(log.calls).toHaveLength(DIALOGS * PER_DIALOG);
      expect(log.peak, 'handlers at once (maxReaders)').toBeLessThanOrEqual(4);
      expect(log.overlaps).toEqual([]);
      expect(outOfOrder(sequencesByConversation(log.calls))).toEqual([]);
    });

    it('one dialog with 1,000 messages: its handlers never overlap and run in order; the table queue runs at most one of them at a time', async () => {
      const name = 'onedialog';
      const log = new CallLog<Keyed>();
      const app = await suite.boot({
        queues: { [name]: { minReceivers: 1, maxReceivers: 4, minReaders: 1, maxReaders: 4 } },
        handlers: { [name]: log.handler() },
      });
      // One conversation group is one ordered group: however many readers the queue has, one runs it.
      let busiest = 0;
      const watch = setInterval(() => {
        const mine = app.consumer().queues.find((q) => q.queue === name);
        busiest = Math.max(busiest, mine?.running ?? 0);
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
      expect(busiest, "the table queue's busy readers").toBe(1);
      expect(log.overlaps).toEqual([]);
      expect(new Set(log.calls.map((c) => c.context.conversationHandle)).size, 'one conversation').toBe(1);
      expect(outOfOrder(sequencesByConversation(log.calls))).toEqual([]);
      expect(log.bodies().map((b) => b.n)).toEqual(Array.from({ length: 1_000 }, (_, n) => n));
    });

    it('a dropped activation event notification: health down, recreated and reported, and the queue is still read', async () => {
      const name = 'lostnote';
      const log = new CallLog<Keyed>();
      const app = await suite.boot({
        queues: { [name]: { minReceivers: 1, maxReceivers: 2 } },
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
      // Sent while it is missing: the running receiver (and the poll) still move it.
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
      expect(app.events.receivers(name)).toBeGreaterThanOrEqual(1);
    });

    it('closing the application while receivers wait in WAITFOR is prompt and loses nothing; six times leaves the queue enabled', async () => {
      const name = 'shutdown';
      // A long WAITFOR: a close that waited it out would take 20 s.
      const broker = { waitTimeoutMs: 20_000, requestTimeoutMs: 40_000 };
      const queues = { [name]: { minReceivers: 2, maxReceivers: 2 } };
      const viewServerState = await suite.canViewServerState();
      if (!viewServerState) console.warn('broker-activation: request count skipped, the login lacks VIEW SERVER STATE');
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
          // Both receivers back in their WAITFOR (GET CONVERSATION GROUP): idle, each with a request running.
          await waitFor(
            () => app.snapshot().queues.find((q) => q.queue === name),
            (q) => q?.receivers === 2 && q.busyReceivers === 0,
            { what: 'two idle receivers' },
          );
          if (viewServerState) {
            await waitFor(
              () => sessionsOfThisProcess(REQUESTS_OF_PROCESS),
              // The two receivers, the activation listener and the initiator reader: each in its WAITFOR.
              (sessions) => sessions >= 4,
              { what: 'receivers waiting in WAITFOR' },
            );
          }
        } finally {
          const started = Date.now();
          await app.close();
          expect(Date.now() - started, `round ${round}: close took`).toBeLessThan(10_000);
        }
        expect(await sessionsOfThisProcess(OPEN_TRANSACTIONS_OF_PROCESS), 'transactions left open').toBe(0);
      }
      // Sent while no receiver runs: the next application gets it.
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
      expect(await suite.queueStatus(suite.queue(name).queue)).toMatchObject({ ReceiveEnabled: 1, PoisonHandling: 0 });
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
