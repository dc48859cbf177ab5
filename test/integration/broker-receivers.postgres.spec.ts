/**
 * Service Broker queues as issue 21 builds them, on PostgreSQL: what they share with the table
 * queue runs for real (the receivers and their pool, the move into ordered groups of the table
 * queue, its consumer, leases, retries and dead state, the broker job handler), on a double of
 * Service Broker's side (test/helpers/pg-broker-double.ts). The same behaviour against a real
 * server is in test/integration/mssql/broker-*.mssql.spec.ts.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { encodeBrokerBody } from '../../lib/src/broker/broker.body.js';
import { BROKER_SYSTEM } from '../../lib/src/broker/broker.names.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import type { BrokerBodyFormat, BrokerMessageContext, BrokerQueueOptions } from '../../lib/src/broker/broker.types.js';
import { SqlQueueUnrecoverableError } from '../../lib/src/core/errors.js';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import { PG_URL } from '../helpers/databases.js';
import { startBrokerEngine, type BrokerEngine } from '../helpers/broker-engine.js';
import { PgBrokerDouble } from '../helpers/pg-broker-double.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';

const db = migratedPgStore('brkrecv', 10);
const engines: BrokerEngine[] = [];
const doubles: PgBrokerDouble[] = [];

afterEach(async () => {
  await Promise.all(engines.splice(0).map((engine) => engine.stop(2_000)));
});
afterAll(async () => {
  await Promise.all(doubles.map((double) => double.close()));
});

/** A broker queue of its own per test (its table queue too), with a double of its Service Broker queue. */
async function brokerQueue(name: string, options: BrokerQueueOptions = {}) {
  const queue = resolveBrokerOptions({ queues: { [name]: options } }, db.schema)!.queues[0]!;
  const double = new PgBrokerDouble({ url: PG_URL, schema: db.schema, store: db.store, queues: [queue] });
  await double.install();
  doubles.push(double);
  return { queue, double };
}

const json = (value: unknown, format: BrokerBodyFormat = 'json') => encodeBrokerBody(format, value, 1 << 20, 'test');

/** A handler recording every run: its body, origin and times, overlaps per conversation. */
class Runs {
  readonly done: { body: unknown; context: BrokerMessageContext; startedAt: number; endedAt: number }[] = [];
  readonly started: { key: string; attempt: number; at: number }[] = [];
  readonly overlaps: string[] = [];
  private readonly busy = new Map<string, number>();

  handler(work: (body: unknown, context: BrokerMessageContext) => Promise<void> = async () => undefined) {
    return async (body: unknown, context: BrokerMessageContext) => {
      const conversation = context.conversationHandle;
      if ((this.busy.get(conversation) ?? 0) > 0)
        this.overlaps.push(`${conversation}#${context.messageSequenceNumber}`);
      this.busy.set(conversation, (this.busy.get(conversation) ?? 0) + 1);
      const startedAt = performance.now();
      this.started.push({
        key: `${conversation}#${context.messageSequenceNumber}`,
        attempt: context.attempt,
        at: startedAt,
      });
      try {
        await work(body, context);
        this.done.push({ body, context, startedAt, endedAt: performance.now() });
      } finally {
        this.busy.set(conversation, this.busy.get(conversation)! - 1);
      }
    };
  }

  /** Completed runs' sequence numbers per conversation, in completion order. */
  sequences(): Map<string, number[]> {
    const by = new Map<string, number[]>();
    for (const { context } of this.done) {
      by.set(context.conversationHandle, [
        ...(by.get(context.conversationHandle) ?? []),
        Number(context.messageSequenceNumber),
      ]);
    }
    return by;
  }
}

async function unfinished(queue: string): Promise<number> {
  const stats = await db.store.stats(queue);
  return stats.ready + stats.delayed + stats.leased;
}

describe('broker queues on the table queue (issue 21): receivers move messages, handlers run jobs', () => {
  it('many conversations, three receivers, six handlers: each message exactly once, each conversation in order, never two at once', async () => {
    const { queue, double } = await brokerQueue('many', {
      minReceivers: 3,
      maxReceivers: 3,
      maxReaders: 6,
      messagesPerTransaction: 20,
    });
    const runs = new Runs();
    const moved: number[] = [];
    const listener: QueueEventListener = { brokerMoved: (event) => void moved.push(event.moved) };
    engines.push(
      await startBrokerEngine({
        store: db.store,
        double,
        queue,
        listeners: [listener],
        handler: runs.handler(() => new Promise((resolve) => setTimeout(resolve, Math.random() * 3))),
      }),
    );
    const conversations = Array.from({ length: 8 }, () => double.conversation('many'));
    // Sent while the receivers run, interleaved across conversations.
    for (let n = 1; n <= 40; n++) {
      await Promise.all(conversations.map((c) => double.send(c, json({ n }))));
    }
    await waitFor(
      () => runs.done.length,
      (count) => count >= 320,
      { timeoutMs: 60_000, what: 'all 320 messages handled' },
    );
    await waitFor(
      () => unfinished('many'),
      (n) => n === 0,
      { what: 'no job left unfinished' },
    );
    expect(runs.done).toHaveLength(320);
    const keys = runs.done.map((r) => `${r.context.conversationHandle}#${r.context.messageSequenceNumber}`);
    expect(new Set(keys).size).toBe(320);
    for (const [conversation, sequence] of runs.sequences()) {
      expect(sequence, conversation).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
    }
    expect(runs.overlaps).toEqual([]);
    expect(runs.done.every((r) => (r.body as { n: number }).n === Number(r.context.messageSequenceNumber))).toBe(true);
    expect(await double.waiting('many')).toBe(0);
    expect(moved.reduce((a, b) => a + b, 0)).toBe(320);
    expect((await db.store.stats('many')).dead).toBe(0);
  });

  it('a message waiting for its retry holds its conversation, not a handler: another conversation runs at once (review 2, R2-5)', async () => {
    const { queue, double } = await brokerQueue('backoff', {
      minReaders: 1,
      maxReaders: 1,
      backoff: { type: 'fixed', delayMs: 30_000 },
    });
    const runs = new Runs();
    let failedAt = 0;
    engines.push(
      await startBrokerEngine({
        store: db.store,
        double,
        queue,
        handler: runs.handler(async (body, context) => {
          if ((body as { id: string }).id === 'a1' && context.attempt === 1) {
            failedAt = performance.now();
            throw new Error('downstream 503');
          }
        }),
      }),
    );
    const a = double.conversation('backoff');
    const b = double.conversation('backoff');
    await double.send(a, json({ id: 'a1' }));
    await double.send(a, json({ id: 'a2' }));
    await waitFor(
      () => failedAt,
      (at) => at > 0,
      { what: 'a1 failed once' },
    );
    await double.send(b, json({ id: 'b1' }));
    await waitFor(
      () => runs.done.map((r) => (r.body as { id: string }).id),
      (ids) => ids.includes('b1'),
      { timeoutMs: 5_000, what: 'b1 handled while a1 waits for its retry' },
    );
    const b1 = runs.done.find((r) => (r.body as { id: string }).id === 'b1')!;
    // Within 2 s of its send, by the only handler: the retry pinned nothing (the old reader slept 5 s holding the group).
    expect(b1.endedAt - failedAt).toBeLessThan(2_000);
    // a's conversation waits behind a1: a2 has not run, a1 is delayed, not dead.
    expect(runs.done.map((r) => (r.body as { id: string }).id)).toEqual(['b1']);
    const stats = await db.store.stats('backoff');
    expect([stats.delayed, stats.retrying, stats.dead]).toEqual([1, 1, 0]);
  });

  it("a Close message (the sender's recycle) ends its conversation only after every message before it was handled", async () => {
    const { queue, double } = await brokerQueue('recycle', { maxReaders: 4, backoff: { type: 'fixed', delayMs: 100 } });
    const runs = new Runs();
    engines.push(
      await startBrokerEngine({
        store: db.store,
        double,
        queue,
        handler: runs.handler(async (body, context) => {
          const { n } = body as { n: number };
          if (n === 2 && context.attempt === 1) throw new Error('fails once');
          await new Promise((resolve) => setTimeout(resolve, 20));
        }),
      }),
    );
    const old = double.conversation('recycle');
    for (let n = 1; n <= 3; n++) await double.send(old, json({ n }));
    await double.send(old, null, queue.closeMessageType);
    await waitFor(
      () => double.ended('recycle'),
      (ended) => ended.length === 1,
      { what: 'the old dialog ended' },
    );
    const [ended] = await double.ended('recycle');
    expect(ended).toMatchObject({ handle: old.handle, byMove: false });
    // The handler never saw Close; message 3 (behind 2's retry) was handled before the end.
    expect(runs.done.map((r) => (r.body as { n: number }).n)).toEqual([1, 2, 3]);
    const third = runs.done[2]!;
    expect(ended!.at.getTime()).toBeGreaterThanOrEqual(Math.floor(performance.timeOrigin + third.endedAt) - 5);
    await waitFor(
      () => unfinished('recycle'),
      (n) => n === 0,
      { what: 'the Close job done' },
    );
  });

  it('EndDialog and Error end the conversation in the move and become no job; DialogTimer is dropped', async () => {
    const { queue, double } = await brokerQueue('ending');
    const runs = new Runs();
    engines.push(await startBrokerEngine({ store: db.store, double, queue, handler: runs.handler() }));
    const one = double.conversation('ending');
    const two = double.conversation('ending');
    await double.send(one, json({ n: 1 }));
    await double.send(one, null, BROKER_SYSTEM.END_DIALOG);
    await double.send(two, null, BROKER_SYSTEM.DIALOG_TIMER);
    await double.send(two, null, BROKER_SYSTEM.ERROR);
    await waitFor(
      () => double.ended('ending'),
      (ended) => ended.length === 2,
      { what: 'both conversations ended' },
    );
    await waitFor(
      () => runs.done.length,
      (n) => n === 1,
      { what: 'the one application message handled' },
    );
    expect((await double.ended('ending')).map((e) => [e.handle, e.byMove]).sort()).toEqual(
      [
        [one.handle, true],
        [two.handle, true],
      ].sort(),
    );
    expect(await double.waiting('ending')).toBe(0);
    const stats = await db.store.stats('ending');
    expect(stats.ready + stats.delayed + stats.leased + stats.dead).toBe(0);
  });

  it('an Error received before the rest of its conversation: the rest is moved before the conversation ends, none deleted unread', async () => {
    // One message per move: the Error (sequence 0, as one the broker raises itself) comes alone.
    const { queue, double } = await brokerQueue('errorfirst', { messagesPerTransaction: 1 });
    const runs = new Runs();
    engines.push(await startBrokerEngine({ store: db.store, double, queue, handler: runs.handler() }));
    const c = double.conversation('errorfirst');
    await double.send(c, null, BROKER_SYSTEM.ERROR, 0n);
    for (let n = 1; n <= 3; n++) await double.send(c, json({ n }));
    await waitFor(
      () => runs.done.length,
      (n) => n === 3,
      { what: 'the three messages behind the Error handled' },
    );
    expect(runs.done.map((r) => r.body)).toEqual([{ n: 1 }, { n: 2 }, { n: 3 }]);
    expect((await double.ended('errorfirst')).map((e) => [e.handle, e.byMove])).toEqual([[c.handle, true]]);
    expect(await double.waiting('errorfirst')).toBe(0);
  });

  it("a message out of attempts is a dead job; with groupOnDead 'continue' its conversation goes on", async () => {
    const { queue, double } = await brokerQueue('deadcont', {
      maxAttempts: 2,
      backoff: { type: 'fixed', delayMs: 10 },
    });
    const runs = new Runs();
    engines.push(
      await startBrokerEngine({
        store: db.store,
        double,
        queue,
        handler: runs.handler(async (body) => {
          if ((body as { n: number }).n === 2) throw new Error('poison');
        }),
      }),
    );
    const c = double.conversation('deadcont');
    for (let n = 1; n <= 3; n++) await double.send(c, json({ n }));
    await waitFor(
      () => runs.done.length,
      (n) => n === 2,
      { what: 'messages 1 and 3' },
    );
    await waitFor(
      async () => (await db.store.stats('deadcont')).dead,
      (n) => n === 1,
      { what: 'message 2 dead' },
    );
    expect(runs.done.map((r) => (r.body as { n: number }).n)).toEqual([1, 3]);
    expect(runs.started.filter((s) => s.key === `${c.handle}#2`).map((s) => s.attempt)).toEqual([1, 2]);
    const [dead] = (await db.store.listDead('deadcont', { limit: 10 })).jobs;
    expect(dead).toMatchObject({ groupKey: c.group, attempts: 2, lastError: expect.stringContaining('poison') });
  });

  it("with groupOnDead 'block' the conversation waits behind its dead message; retryDead runs it again in its place", async () => {
    const { queue, double } = await brokerQueue('deadblock', { maxAttempts: 1, groupOnDead: 'block' });
    const runs = new Runs();
    let healed = false;
    engines.push(
      await startBrokerEngine({
        store: db.store,
        double,
        queue,
        handler: runs.handler(async (body) => {
          if ((body as { n: number }).n === 2 && !healed) throw new Error('not yet');
        }),
      }),
    );
    const c = double.conversation('deadblock');
    for (let n = 1; n <= 3; n++) await double.send(c, json({ n }));
    await waitFor(
      async () => (await db.store.stats('deadblock')).blockedGroups,
      (n) => n === 1,
      { what: 'blocked' },
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(runs.done.map((r) => (r.body as { n: number }).n)).toEqual([1]);
    healed = true;
    const [dead] = (await db.store.listDead('deadblock', { limit: 10 })).jobs;
    await db.store.retryDead('deadblock', [dead!.id]);
    await waitFor(
      () => runs.done.length,
      (n) => n === 3,
      { what: 'the retried message, then the one behind it' },
    );
    expect(runs.done.map((r) => (r.body as { n: number }).n)).toEqual([1, 2, 3]);
  });

  it('a body that does not decode dies at once (unrecoverable), with the reason kept; the conversation goes on', async () => {
    const { queue, double } = await brokerQueue('badbody', { maxAttempts: 5 });
    const runs = new Runs();
    const failures: { dead: boolean; error: string }[] = [];
    engines.push(
      await startBrokerEngine({
        store: db.store,
        double,
        queue,
        listeners: [{ failed: (event) => void failures.push(event) }],
        handler: runs.handler(),
      }),
    );
    const c = double.conversation('badbody');
    await double.send(c, Buffer.from('{"truncated":', 'utf16le'));
    await double.send(c, json({ n: 2 }));
    await waitFor(
      () => runs.done.length,
      (n) => n === 1,
      { what: 'the good message' },
    );
    await waitFor(
      () => failures.length,
      (n) => n === 1,
      { what: 'the bad one failed' },
    );
    expect(failures[0]).toMatchObject({
      dead: true,
      error: expect.stringMatching(/message body is not JSON.*format 'json'/),
    });
    expect(new SqlQueueUnrecoverableError('x')).toBeInstanceOf(Error);
    expect((await db.store.stats('badbody')).dead).toBe(1);
  });

  it('a move whose enqueue fails gives its messages back: none lost, none moved twice', async () => {
    const { queue, double } = await brokerQueue('giveback');
    const runs = new Runs();
    let failuresLeft = 3;
    double.beforeEnqueue = () => {
      if (failuresLeft-- > 0) throw new Error('enqueue refused (test)');
    };
    engines.push(await startBrokerEngine({ store: db.store, double, queue, handler: runs.handler() }));
    const c = double.conversation('giveback');
    for (let n = 1; n <= 5; n++) await double.send(c, json({ n }));
    await waitFor(
      () => runs.done.length,
      (n) => n === 5,
      { timeoutMs: 20_000, what: 'all five, after the failed moves' },
    );
    expect(failuresLeft).toBeLessThan(0);
    expect(runs.done.map((r) => (r.body as { n: number }).n)).toEqual([1, 2, 3, 4, 5]);
    expect(await double.waiting('giveback')).toBe(0);
  });

  it('stopping mid-stream and starting again loses nothing and runs nothing twice', async () => {
    const { queue, double } = await brokerQueue('restart', { minReceivers: 2, maxReaders: 3 });
    const runs = new Runs();
    const first = await startBrokerEngine({
      store: db.store,
      double,
      queue,
      handler: runs.handler(() => new Promise((resolve) => setTimeout(resolve, 5))),
    });
    const conversations = Array.from({ length: 4 }, () => double.conversation('restart'));
    for (let n = 1; n <= 25; n++) await Promise.all(conversations.map((c) => double.send(c, json({ n }))));
    await waitFor(
      () => runs.done.length,
      (n) => n >= 20,
      { what: 'some handled' },
    );
    await first.stop(2_000);
    engines.push(await startBrokerEngine({ store: db.store, double, queue, handler: runs.handler() }));
    await waitFor(
      () => runs.done.length,
      (n) => n >= 100,
      { timeoutMs: 30_000, what: 'the rest after the restart' },
    );
    const keys = runs.done.map((r) => `${r.context.conversationHandle}#${r.context.messageSequenceNumber}`);
    expect(new Set(keys).size).toBe(100);
    expect(keys).toHaveLength(100);
    for (const sequence of runs.sequences().values())
      expect(sequence).toEqual(Array.from({ length: 25 }, (_, i) => i + 1));
  });
});
