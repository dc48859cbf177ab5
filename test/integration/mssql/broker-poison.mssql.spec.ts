/**
 * Poison messages on a Service Broker queue (issue 12; research B (ii) 4, 5 and 9), on both
 * databases. Service Broker disables a queue after five rolled-back receiving transactions in a
 * row; the transport must never let that happen, and must show it when something else does:
 * - a handler that always throws: after maxAttempts its message is in the dead table with the
 *   error, its conversation ended with an error on both sides, the queue still enabled (handler
 *   failures roll back to a savepoint, never the whole transaction); retry and purge work;
 * - a reader process killed mid-handler 4 times (maxAttempts 10): each kill is a full rollback;
 *   the journal, written before each run, shows 4 attempts, and the next reader dead-letters the
 *   message without running it, so the fifth rollback never comes and the queue stays enabled;
 * - five rolled-back receives from another session do disable the queue: the health indicator
 *   goes down, and ALTER QUEUE … WITH STATUS = ON recovers it with nothing lost.
 */
import sql from 'mssql';
import { afterEach, expect, it } from 'vitest';
import { enableQueue, receiveAny } from '../../helpers/broker-test-queries.js';
import { beginCallerTransaction, mssqlRows } from '../../helpers/mssql.js';
import { deferred, waitFor } from '../../helpers/wait-for.js';
import { killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';
import type { BrokerWorkerConfig } from '../../workers/broker-worker.js';
import { brokerSuite, CallLog, strandedEndpoints } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

describeEachMssqlDatabase('Service Broker: poison messages never disable the queue', (db) => {
  const suite = brokerSuite(db, 'brkpsn');
  afterEach(() => killAllWorkers());

  it('a handler that always throws: dead after maxAttempts with its error, conversation ended with an error, queue enabled; retry and purge', async () => {
    const name = 'poison';
    let fail = true;
    const attempts: number[] = [];
    const log = new CallLog<{ n: number }>();
    const { producer, events } = await suite.boot({
      queues: { [name]: { maxAttempts: 3, backoff: { type: 'fixed', delayMs: 50 } } },
      handlers: {
        [name]: log.handler(async (body, context) => {
          if (!fail) return;
          attempts.push(context.attempt);
          throw new Error(`poison ${body.n} attempt ${context.attempt}`);
        }),
      },
    });
    const { conversationHandle } = await producer.send(name, { n: 1 }, { groupKey: 'p' });
    expect(conversationHandle, 'the first send of a key opens its dialog').not.toBeNull();
    const dead = await waitFor(
      () => producer.listDeadMessages(name),
      (page) => page.messages.length === 1,
      { what: 'the poison message in the dead table' },
    );
    expect(attempts).toEqual([1, 2, 3]);
    expect(dead.messages[0]).toMatchObject({
      queue: name,
      reason: 'max-attempts',
      attempts: 3,
      crashes: 0, // no full rollback: each failure went back to the savepoint
      body: { n: 1 },
    });
    expect(dead.messages[0]!.lastError).toContain('poison 1 attempt 3');
    expect(events.of('brokerFailed', name).map((e) => e.dead)).toEqual([false, false, true]);
    expect(events.of('brokerDeadLettered', name)).toMatchObject([{ reason: 'max-attempts', count: 1 }]);
    expect(await suite.receiveEnabled(name)).toBe(1);

    // The target ended the conversation with an error; the initiator ended its side on that Error.
    await waitFor(
      () => suite.endpointsOf(conversationHandle!),
      (rows) => rows.every((row) => row.State === 'CLOSED'),
      { what: 'both endpoints of the poisoned conversation closed' },
    );
    expect(strandedEndpoints(await suite.endpointsByState(name))).toEqual({});
    expect((await producer.brokerStats(name)).dead).toBe(1);

    // retryDeadMessages sends it again (on a new dialog): handled once the handler is fixed.
    fail = false;
    expect(await producer.retryDeadMessages(name, 'all')).toEqual([dead.messages[0]!.id]);
    await waitFor(
      () => log.calls.length,
      (n) => n === 1,
      { what: 'the retried message' },
    );
    expect(log.bodies()).toEqual([{ n: 1 }]);
    expect((await producer.brokerStats(name)).dead).toBe(0);

    // purgeDeadMessages deletes them.
    fail = true;
    await producer.send(name, { n: 2 }, { groupKey: 'p' });
    await waitFor(
      () => producer.listDeadMessages(name),
      (page) => page.messages.length === 1,
      { what: 'the second poison message in the dead table' },
    );
    expect(await producer.purgeDeadMessages(name)).toBe(1);
    expect((await producer.listDeadMessages(name)).messages).toEqual([]);
    expect(await suite.receiveEnabled(name)).toBe(1);
  });

  it('a reader killed mid-handler 4 times (maxAttempts 10): the next reader dead-letters it without running it; the queue stays enabled', async () => {
    const name = 'crash';
    // A producer-only application: creates the objects and sends; the workers consume.
    const sender = await suite.boot({
      queues: { [name]: { maxAttempts: 10 } },
      module: { consumer: { enabled: false } },
    });
    await sender.producer.send(name, { crash: true }, { groupKey: 'crash' });
    const config: BrokerWorkerConfig = {
      dialect: 'mssql',
      url: db.url,
      schema: suite.schema,
      queue: name,
      brokerMode: 'hang',
      maxAttempts: 10,
      events: true,
    };
    for (let attempt = 1; attempt <= 4; attempt++) {
      const worker = await WorkerProcess.start(config, 'broker-worker.js');
      // 'started' comes after the attempt's journal row committed.
      const started = await worker.next((m) => m.type === 'started');
      expect(started.attempt, `run ${attempt}`).toBe(attempt);
      worker.kill('SIGKILL'); // the connection drops: SQL Server rolls the receive back
      await worker.exited;
    }
    const normal: BrokerWorkerConfig = { ...config, brokerMode: 'normal' };
    const fifth = await WorkerProcess.start(normal, 'broker-worker.js');
    const deadLettered = await fifth.event('brokerDeadLettered', (m) => m.queue === name);
    expect(deadLettered).toMatchObject({ reason: 'crashes', count: 1 });
    expect(fifth.received('started'), 'the handler did not run a fifth time').toEqual([]);
    const { messages } = await sender.producer.listDeadMessages(name);
    expect(messages).toHaveLength(1);
    expect(messages[0]).toMatchObject({ reason: 'crashes', attempts: 4, crashes: 4, body: { crash: true } });
    expect(await suite.receiveEnabled(name)).toBe(1);
    await fifth.stop();
  });

  it('five rolled-back receives disable the queue: health goes down; ALTER QUEUE … STATUS = ON recovers it', async () => {
    const name = 'disabled';
    const queue = suite.queue(name, { minReaders: 1, maxReaders: 1 }).queue;
    const release = deferred<void>();
    const log = new CallLog<{ n: number }>();
    const app = await suite.boot({
      queues: { [name]: { minReaders: 1, maxReaders: 1 } },
      handlers: {
        [name]: log.handler(async (body) => {
          if (body.n === 1) await release.promise;
        }),
      },
    });
    await waitFor(
      () => app.health(name),
      (health) => health.status === 'up',
      { what: 'a healthy queue' },
    );
    // The only reader holds message 1's group (its handler waits), so message 2 stays queued.
    await app.producer.send(name, { n: 1 }, { groupKey: 'a' });
    await waitFor(
      () => log.running,
      (running) => running === 1,
      { what: 'the handler of message 1' },
    );
    await app.producer.send(name, { n: 2 }, { groupKey: 'b' });
    for (let i = 1; i <= 5; i++) {
      const session = await beginCallerTransaction(db.url);
      try {
        const got = await new sql.Request(session.transaction).query<{ Handle: string }>(receiveAny(queue));
        expect(got.recordset, `receive ${i} got message 2`).toHaveLength(1);
      } finally {
        await session.close(); // rolls back: message 2 returns to the queue
      }
    }
    await waitFor(
      () => suite.receiveEnabled(name),
      (enabled) => enabled === 0,
      { what: 'the queue disabled by poison-message detection' },
    );
    const down = await waitFor(
      () => app.health(name),
      (health) => health.status === 'down',
      { what: 'health down' },
    );
    expect(JSON.stringify(down)).toMatch(/is_receive_enabled = 0|disabled/);

    await mssqlRows(db.url, enableQueue(queue));
    release.resolve();
    await waitFor(
      () => log.calls.length,
      (n) => n === 2,
      { what: 'both messages after the queue is enabled again' },
    );
    expect(log.handledNs()).toEqual([1, 2]);
    await waitFor(
      () => app.health(name),
      (health) => health.status === 'up',
      { timeoutMs: 20_000, what: 'health up again' },
    );
  });
});
