/**
 * Service Broker transport (issue 12; research B (ii) 1 and 2; issue 21), on both databases:
 * - 2 to 4 receivers moving messages, 4 handler readers, 50 dialogs × 100 messages: within a
 *   conversation, handler calls follow message_sequence_number and never overlap (a receive
 *   takes one conversation group's messages in order, and they run as one ordered group of the
 *   table queue), while different dialogs run at the same time; every message becomes one job;
 * - a conversation group another session holds in an open transaction is skipped by the
 *   receivers (its WAITFOR and its RECEIVE), and moved and handled once that session commits.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { holdConversationGroup } from '../../helpers/broker-test-queries.js';
import { beginCallerTransaction } from '../../helpers/mssql.js';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, CallLog, outOfOrder, sequencesByConversation } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

interface Keyed {
  key: string;
  n: number;
}

describeEachMssqlDatabase('Service Broker: conversation-group locks keep each dialog in order', (db) => {
  const suite = brokerSuite(db, 'brkord');

  it('2-4 receivers and 4 handler readers, 50 dialogs × 100 messages: per conversation in sequence order, never overlapping; dialogs in parallel; one job per message', async () => {
    const DIALOGS = 50;
    const PER_DIALOG = 100;
    const log = new CallLog<Keyed>();
    const { producer, events } = await suite.boot({
      queues: {
        orders: { minReceivers: 2, maxReceivers: 4, minReaders: 4, maxReaders: 4, messagesPerTransaction: 10 },
      },
      handlers: { orders: log.handler() },
    });
    const keys = Array.from({ length: DIALOGS }, (_, i) => `dialog-${i}`);
    const handles = new Map<string, Set<string>>();
    // One producer per key, each sending its key's messages in order; keys interleave.
    await Promise.all(
      keys.map(async (key) => {
        for (let n = 0; n < PER_DIALOG; n++) {
          const { conversationHandle } = await producer.send('orders', { key, n }, { groupKey: key });
          handles.set(key, (handles.get(key) ?? new Set<string>()).add(String(conversationHandle)));
        }
      }),
    );
    await waitFor(
      () => log.calls.length,
      (n) => n >= DIALOGS * PER_DIALOG,
      { timeoutMs: 90_000, intervalMs: 200, what: `${DIALOGS * PER_DIALOG} handled messages` },
    );

    expect(log.overlaps, 'two calls of one conversation at once').toEqual([]);
    expect(log.calls).toHaveLength(DIALOGS * PER_DIALOG); // none handled twice
    // Each key went out on one dialog, which arrives as one conversation at the target.
    for (const key of keys) expect(handles.get(key)?.size, key).toBe(1);
    const byConversation = sequencesByConversation(log.calls);
    expect(byConversation.size).toBe(DIALOGS);
    expect(outOfOrder(byConversation), 'conversations handled out of sequence order').toEqual([]);
    for (const key of keys) {
      const ns = log.calls.filter((c) => c.body.key === key).map((c) => c.body.n);
      expect(ns, key).toEqual(Array.from({ length: PER_DIALOG }, (_, n) => n));
    }
    // The dialogs did not queue up behind one another.
    expect(log.peak).toBeGreaterThan(1);
    expect(log.peak).toBeLessThanOrEqual(4);
    expect(events.peakReceivers('orders')).toBeGreaterThanOrEqual(2);
    // Each message moved once into one job, done once.
    expect(events.moved('orders')).toBe(DIALOGS * PER_DIALOG);
    const jobs = await suite.jobsByMessage('orders');
    expect(jobs).toHaveLength(DIALOGS * PER_DIALOG);
    expect(jobs.filter((j) => Number(j.Jobs) !== 1 || Number(j.Done) !== 1)).toEqual([]);
  });

  it('a conversation group another session holds is skipped by the receivers, and moved and handled once that session commits', async () => {
    const name = 'held';
    // A producer-only application creates the objects and sends; nothing here reads the target queue.
    const sender = await suite.boot({ queues: { [name]: {} }, module: { consumer: { enabled: false } } });
    const { conversationHandle } = await sender.producer.send(name, { key: 'held', n: 0 }, { groupKey: 'held' });
    expect(conversationHandle, 'the first send of a key opens its dialog').not.toBeNull();
    const target = await waitFor(
      () => suite.endpointsOf(conversationHandle!),
      (rows) => rows.some((row) => row.Initiator === 0),
      { what: 'the target endpoint of the held dialog' },
    );
    const group = target.find((row) => row.Initiator === 0)!.GroupId;

    // Session A takes the group's lock in a transaction it keeps open; its message stays queued.
    const holder = await beginCallerTransaction(db.url);
    try {
      const seen = await new sql.Request(holder.transaction)
        .input('group', sql.UniqueIdentifier, group)
        .query<{ Handle: string }>(holdConversationGroup(suite.queue(name).queue));
      expect(seen.recordset, 'the held group has its message').toHaveLength(1);

      for (let k = 0; k < 10; k++) {
        await sender.producer.send(name, { key: `free-${k}`, n: 0 }, { groupKey: `free-${k}` });
      }
      const log = new CallLog<Keyed>();
      const consumer = await suite.boot({
        queues: { [name]: { minReceivers: 2, maxReceivers: 2, minReaders: 2, maxReaders: 2 } },
        handlers: { [name]: log.handler() },
      });
      await waitFor(
        () => log.calls.length,
        (n) => n >= 10,
        { what: 'the ten free dialogs' },
      );
      expect(log.bodies().map((b) => b.key)).not.toContain('held');
      // The receivers keep waiting beside the lock: nothing of the held group was moved.
      expect(await suite.receiveEnabled(name)).toBe(1);
      expect(consumer.events.moved(name)).toBe(10);
      expect(log.bodies().map((b) => b.key)).not.toContain('held');

      await holder.commit();
      await waitFor(() => log.bodies().some((b) => b.key === 'held'), Boolean, {
        what: 'the held message once its group is released',
      });
      expect(log.calls).toHaveLength(11);
      expect(consumer.events.moved(name)).toBe(11);
    } finally {
      await holder.close();
    }
  });
});
