/**
 * Service Broker dialogs (issue 12; research B (ii) 3 and 11, and the transactional send; issue
 * 21), on both databases:
 * - a T-SQL producer that ends its side normally (EndDialog) or with an error (Error): the
 *   receiver's move ends the target side too, no job is made of the system message, and no
 *   DISCONNECTED_INBOUND endpoint is left;
 * - 1,000 sends for 10 group keys travel on 10 conversations, in order per key at the target;
 * - with a short dialogRecycleMs, dialogs are replaced through the close handshake while sends go
 *   on: the Close message becomes a job of the conversation's ordered group, whose handler ends
 *   the conversation only after every message before it was handled, so nothing sent on the new
 *   dialog is handled before the last message of the old one; nothing is lost or reordered, and
 *   no endpoint is stranded;
 * - a send in a caller's transaction that rolls back delivers nothing; one that commits arrives.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { encodeBrokerBody } from '../../../lib/src/broker/broker.body.js';
import {
  brokerJobsByType,
  END_CONVERSATION,
  END_CONVERSATION_WITH_ERROR,
  sendOnNewDialog,
} from '../../helpers/broker-test-queries.js';
import { beginCallerTransaction, mssqlRows } from '../../helpers/mssql.js';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, CallLog, outOfOrder, sequencesByConversation, strandedEndpoints } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

interface Keyed {
  key: string;
  n: number;
}

describeEachMssqlDatabase('Service Broker: dialogs end on both sides, are reused per key and recycled', (db) => {
  const suite = brokerSuite(db, 'brkdlg');

  /** Jobs of broker queue `name`'s table queue by the message type they carry and their state. */
  async function jobsByType(name: string): Promise<{ Type: string; State: string; Jobs: number }[]> {
    const rows = await mssqlRows<{ Type: string; State: string; Jobs: number | string }>(
      db.url,
      brokerJobsByType(suite.schema),
      (r) => r.input('queue', sql.NVarChar(128), name),
    );
    return rows.map((row) => ({ ...row, Jobs: Number(row.Jobs) })).sort((a, b) => a.Type.localeCompare(b.Type));
  }

  /** A dialog begun by a T-SQL producer on our initiator service, with one JSON message. */
  async function tsqlDialog(name: string, body: unknown): Promise<string> {
    const bytes = encodeBrokerBody('json', body, 1024 * 1024, 'test');
    const [row] = await mssqlRows<{ Handle: string }>(db.url, sendOnNewDialog(suite.queue(name)), (r) =>
      r.input('body', sql.VarBinary(sql.MAX), bytes),
    );
    return row!.Handle;
  }

  for (const [how, statement] of [
    ['EndDialog', END_CONVERSATION],
    ['Error', END_CONVERSATION_WITH_ERROR],
  ] as const) {
    it(`the initiator ends with ${how}: the target ends its side, and no DISCONNECTED_INBOUND endpoint is left`, async () => {
      const name = `ends${how}`;
      const log = new CallLog<{ how: string }>();
      await suite.boot({ queues: { [name]: {} }, handlers: { [name]: log.handler() } });
      const handle = await tsqlDialog(name, { how });
      await waitFor(
        () => log.calls.length,
        (n) => n === 1,
        { what: 'the T-SQL producer’s message' },
      );
      await mssqlRows(db.url, statement, (r) => r.input('handle', sql.UniqueIdentifier, handle));
      // The target reader receives the system message and ends the conversation on its side.
      const ended = await waitFor(
        () => suite.endpointsOf(handle),
        (rows) => rows.every((row) => row.State === 'CLOSED'),
        { what: `both endpoints of the conversation closed after ${how}` },
      );
      expect(ended.every((row) => row.State === 'CLOSED')).toBe(true);
      expect(strandedEndpoints(await suite.endpointsByState(name))).toEqual({});
      expect(log.calls).toHaveLength(1); // the system message never reached the handler
      // The move ended the conversation itself: no job was made of the EndDialog or Error message.
      expect(await jobsByType(name)).toEqual([{ Type: suite.queue(name).messageType, State: 'done', Jobs: 1 }]);
    });
  }

  it('1,000 sends for 10 keys use 10 conversations, in order per key at the target', async () => {
    const name = 'reuse';
    const KEYS = 10;
    const PER_KEY = 100;
    const log = new CallLog<Keyed>();
    const { producer } = await suite.boot({
      queues: { [name]: { minReaders: 4, maxReaders: 4 } },
      handlers: { [name]: log.handler() },
    });
    const sent = new Map<string, Set<string>>();
    await Promise.all(
      Array.from({ length: KEYS }, async (_, k) => {
        const key = `key-${k}`;
        for (let n = 0; n < PER_KEY; n++) {
          const { conversationHandle } = await producer.send(name, { key, n }, { groupKey: key });
          // null would mean the message waited in the outbox for a recycled dialog: not expected here.
          sent.set(key, (sent.get(key) ?? new Set<string>()).add(String(conversationHandle)));
        }
      }),
    );
    await waitFor(
      () => log.calls.length,
      (n) => n >= KEYS * PER_KEY,
      { timeoutMs: 60_000, intervalMs: 100, what: `${KEYS * PER_KEY} messages` },
    );
    expect(log.calls).toHaveLength(KEYS * PER_KEY);
    expect([...sent.values()].map((handles) => handles.size)).toEqual(Array(KEYS).fill(1));
    expect(new Set([...sent.values()].flatMap((handles) => [...handles])).size).toBe(KEYS);
    const byConversation = sequencesByConversation(log.calls);
    expect(byConversation.size).toBe(KEYS);
    expect(outOfOrder(byConversation)).toEqual([]);
    for (let k = 0; k < KEYS; k++) {
      const ns = log.calls.filter((c) => c.body.key === `key-${k}`).map((c) => c.body.n);
      expect(ns, `key-${k}`).toEqual(Array.from({ length: PER_KEY }, (_, n) => n));
    }
    expect(log.overlaps).toEqual([]);
  });

  it('dialogs recycled through a Close job while sends go on: the new dialog is handled only after the old one, nothing lost or reordered, no endpoint stranded', async () => {
    const name = 'recycle';
    const KEYS = 3;
    const log = new CallLog<Keyed>();
    const { producer, events } = await suite.boot({
      queues: { [name]: { minReceivers: 2, maxReceivers: 4, minReaders: 2, maxReaders: 4 } },
      // The shortest recycle age the option takes: several handshakes happen during the sends.
      broker: { dialogRecycleMs: 1_000 },
      handlers: { [name]: log.handler() },
    });
    const sent = new Map<string, { n: number; handle: string | null }[]>();
    const until = Date.now() + 5_000;
    await Promise.all(
      Array.from({ length: KEYS }, async (_, k) => {
        const key = `key-${k}`;
        // handle null: the message waited in the outbox while the key's dialog was being closed.
        const mine: { n: number; handle: string | null }[] = [];
        sent.set(key, mine);
        for (let n = 0; Date.now() < until; n++) {
          const { conversationHandle } = await producer.send(name, { key, n }, { groupKey: key });
          mine.push({ n, handle: conversationHandle });
          // Paced, so that the sends span several recycle ages.
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
      }),
    );
    const total = [...sent.values()].reduce((sum, list) => sum + list.length, 0);
    await waitFor(
      () => log.calls.length,
      (n) => n >= total,
      { timeoutMs: 60_000, intervalMs: 100, what: `${total} messages` },
    );
    expect(log.calls).toHaveLength(total);
    for (const [key, list] of sent) {
      const ns = log.calls.filter((c) => c.body.key === key).map((c) => c.body.n);
      expect(ns, `${key}: every message once, in send order across dialogs`).toEqual(list.map((s) => s.n));
      const dialogs = new Set(list.map((s) => s.handle).filter((handle) => handle !== null));
      expect(dialogs.size, `${key} was recycled`).toBeGreaterThan(1);
      // The target's conversations of the key, in the order their messages were sent: each began
      // only after every handler of the one before had returned (its Close job ran after them,
      // and the sender begins the next dialog only once that job ended the old one).
      const calls = log.calls.filter((c) => c.body.key === key);
      const conversations = [...new Set(calls.map((c) => c.context.conversationHandle))];
      // (One more than the handles sends returned when the last dialog carried only messages from the outbox.)
      expect(conversations.length, `${key}: conversations at the target`).toBeGreaterThanOrEqual(dialogs.size);
      for (let i = 1; i < conversations.length; i++) {
        const before = calls.filter((c) => c.context.conversationHandle === conversations[i - 1]);
        const after = calls.filter((c) => c.context.conversationHandle === conversations[i]);
        const lastEnd = Math.max(...before.map((c) => c.endedAt));
        const firstStart = Math.min(...after.map((c) => c.startedAt));
        expect(
          firstStart,
          `${key}: conversation ${i} (first n ${after[0]!.body.n}) started before conversation ${i - 1} (last n ${before.at(-1)!.body.n}) was handled`,
        ).toBeGreaterThanOrEqual(lastEnd);
      }
    }
    expect(log.overlaps).toEqual([]);
    // Each replaced dialog's Close message was a job (never handed to the handler), done.
    const replaced = [...sent.values()].reduce(
      (sum, list) => sum + new Set(list.map((s) => s.handle).filter((handle) => handle !== null)).size - 1,
      0,
    );
    const closeType = suite.queue(name).closeMessageType;
    await waitFor(
      () => jobsByType(name),
      (rows) => rows.every((row) => row.State === 'done'),
      { what: 'every job of the queue done, the Close jobs included' },
    );
    const byType = await jobsByType(name);
    const closeJobs = byType.filter((row) => row.Type === closeType).reduce((sum, row) => sum + row.Jobs, 0);
    expect(closeJobs, 'Close jobs (one per replaced dialog at least)').toBeGreaterThanOrEqual(replaced);
    expect(byType.filter((row) => row.Type !== closeType && row.Type !== suite.queue(name).messageType)).toEqual([]);
    // Completed events, a moment after the statements that recorded them: every message, and
    // every Close job (which no handler saw).
    await waitFor(
      () => events.of('completed', name).length,
      (completed) => completed >= total + closeJobs,
      { what: 'a completed event for every message and every Close job' },
    );
    // Every replaced dialog was ended on both sides; only the current ones (one per key) converse.
    const conversing = (rows: readonly { State: string; Endpoints: number }[]) =>
      rows.filter((row) => row.State === 'CONVERSING').reduce((sum, row) => sum + row.Endpoints, 0);
    const settled = await waitFor(
      () => suite.endpointsByState(name),
      (rows) => Object.keys(strandedEndpoints(rows)).length === 0 && conversing(rows) <= 2 * KEYS,
      { timeoutMs: 20_000, what: 'no stranded endpoints, and at most the current dialog of each key' },
    );
    expect(strandedEndpoints(settled)).toEqual({});
  });

  it('a send in a caller’s transaction is delivered only if the caller commits', async () => {
    const name = 'txsend';
    const log = new CallLog<{ what: string }>();
    const { producer } = await suite.boot({ queues: { [name]: {} }, handlers: { [name]: log.handler() } });

    const rolledBack = await beginCallerTransaction(db.url);
    try {
      await producer.send(name, { what: 'rolled back' }, { groupKey: 'tx', transaction: rolledBack.transaction });
    } finally {
      await rolledBack.close(); // rolls back
    }
    const committed = await beginCallerTransaction(db.url);
    try {
      await producer.send(name, { what: 'committed' }, { groupKey: 'tx', transaction: committed.transaction });
      await committed.commit();
    } finally {
      await committed.close();
    }
    // After it on the same key, so its arrival means the rolled-back one had its chance.
    await producer.send(name, { what: 'marker' }, { groupKey: 'tx' });
    await waitFor(() => log.bodies().some((b) => b.what === 'marker'), Boolean, { what: 'the marker' });
    expect(log.bodies().map((b) => b.what)).toEqual(['committed', 'marker']);
  });
});
