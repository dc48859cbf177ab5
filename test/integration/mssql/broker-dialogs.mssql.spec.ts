/**
 * Service Broker dialogs (issue 12; research B (ii) 3 and 11, and the transactional send), on
 * both databases:
 * - a T-SQL producer that ends its side normally (EndDialog) or with an error (Error): the target
 *   ends its side too, and no DISCONNECTED_INBOUND endpoint is left;
 * - 1,000 sends for 10 group keys travel on 10 conversations, in order per key at the target;
 * - with a short dialogRecycleMs, dialogs are replaced through the close handshake while sends go
 *   on: nothing sent during a handshake is lost or reordered, and no endpoint is stranded;
 * - a send in a caller's transaction that rolls back delivers nothing; one that commits arrives.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { encodeBrokerBody } from '../../../lib/src/broker/broker.body.js';
import { END_CONVERSATION, END_CONVERSATION_WITH_ERROR, sendOnNewDialog } from '../../helpers/broker-test-queries.js';
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

  it('dialogs recycled through the close handshake while sends go on: nothing lost or reordered, no endpoint stranded', async () => {
    const name = 'recycle';
    const KEYS = 3;
    const log = new CallLog<Keyed>();
    const { producer } = await suite.boot({
      queues: { [name]: { minReaders: 2, maxReaders: 4 } },
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
    }
    expect(log.overlaps).toEqual([]);
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
