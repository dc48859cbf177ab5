/**
 * Poison messages on a Service Broker queue (issue 12; issue 21; review 2, R2-1 and R2-4), on both
 * databases. Our queues are created with POISON_MESSAGE_HANDLING (STATUS = OFF): a failing message
 * is the table queue's to retry and dead-letter, and Service Broker's own disable after five
 * rolled-back receives (with its wait for a schema-modification lock) must not happen:
 * - five RECEIVE + ROLLBACK by another session leave our queue enabled, and the consumer handles
 *   the message once, then the next; the same five rollbacks do disable a queue created with
 *   POISON_MESSAGE_HANDLING ON (the control: the experiment reaches Service Broker's detection);
 * - a handler that always fails: after maxAttempts its message is a dead job (listed decoded by
 *   listDeadMessages, retried in its conversation's place by retryDead, removed by purgeDead); the
 *   conversation is not ended, and its later messages go on (groupOnDead 'continue') or wait until
 *   the dead one is retried or purged ('block');
 * - after all of it, no schema-modification lock request waits on any queue of the file's schema.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import {
  createQueueWithPoisonHandling,
  enableQueue,
  ENSURE_SCHEMA,
  SCHEMA_LOCK_WAITS_IN_SCHEMA,
} from '../../helpers/broker-test-queries.js';
import { CaptureLogger } from '../../helpers/capture-logger.js';
import { mssqlRows } from '../../helpers/mssql.js';
import { waitFor } from '../../helpers/wait-for.js';
import type { BrokerMessageContext, GroupOnDead } from '../../../lib/src/index.js';
import { brokerSuite, CallLog } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

interface Numbered {
  n: number;
}

describeEachMssqlDatabase('Service Broker: poison messages never disable the queue', (db) => {
  const suite = brokerSuite(db, 'brkpsn');

  /** Waits until `queue` has `count` messages: a send committed is in the target queue at once (local delivery). */
  const queued = (queue: Parameters<typeof suite.messagesIn>[0], count: number, what: string) =>
    waitFor(
      () => suite.messagesIn(queue),
      (n) => n === count,
      { what },
    );

  /** Schema-modification lock requests waiting on `queue` (an empty list without VIEW SERVER STATE: see the last test). */
  async function schemaLockWaiters(queue: Parameters<typeof suite.locksOn>[0]): Promise<string[]> {
    if (!(await suite.canViewServerState())) return [];
    const locks = await suite.locksOn(queue);
    return locks
      .filter((l) => l.Mode === 'Sch-M' && l.Status === 'WAIT')
      .map((l) => `session ${l.Session} on the ${l.On}`);
  }

  it('five RECEIVE + ROLLBACK by another session leave the queue (POISON_MESSAGE_HANDLING OFF) enabled; the consumer handles that message once, then the next', async () => {
    const name = 'rollbacks';
    const queue = suite.queue(name).queue;
    const queues = { [name]: {} };
    const log = new CallLog<Numbered>();
    const first = await suite.boot({ queues, handlers: { [name]: log.handler() }, keep: true });
    try {
      expect(await suite.queueStatus(queue), 'created by the setup').toEqual({
        ReceiveEnabled: 1,
        EnqueueEnabled: 1,
        PoisonHandling: 0,
      });
      await first.producer.send(name, { n: 0 }, { groupKey: 'r' });
      await waitFor(
        () => log.calls.length,
        (n) => n === 1,
        { what: 'message 0' },
      );
    } finally {
      await first.close();
    }

    // No consumer now (review 2, R2-1: no receiver holds a transaction while the rollbacks run).
    const sender = await suite.boot({ queues, module: { consumer: { enabled: false } } });
    await sender.producer.send(name, { n: 1 }, { groupKey: 'r' });
    await queued(queue, 1, 'message 1 in the target queue');
    // An operator "inspecting" a message the way Microsoft's docs show, five times (or five
    // crashed readers): each RECEIVE gets message 1, each rollback returns it.
    await suite.receiveAndRollBack(queue, 5);
    // With STATUS = ON the fifth rollback disables the queue at once (the control test below).
    expect(await suite.queueStatus(queue), 'after five rolled-back receives').toEqual({
      ReceiveEnabled: 1,
      EnqueueEnabled: 1,
      PoisonHandling: 0,
    });
    expect(await suite.messagesIn(queue), 'message 1 is back in the queue').toBe(1);
    // Service Broker may still start its background task (a public report shows it waiting for
    // Sch-M with handling OFF): nothing holds the queue, so it must not be left waiting.
    await waitFor(
      () => schemaLockWaiters(queue),
      (waiters) => waiters.length === 0,
      { what: 'no schema-modification lock request waiting on the queue' },
    );

    const again = await suite.boot({ queues, handlers: { [name]: log.handler() } });
    await waitFor(
      () => log.calls.length,
      (n) => n === 2,
      { what: 'message 1, after the five rollbacks' },
    );
    await again.producer.send(name, { n: 2 }, { groupKey: 'r' });
    await waitFor(
      () => log.calls.length,
      (n) => n === 3,
      { what: 'message 2' },
    );
    expect(log.bodies().map((b) => b.n)).toEqual([0, 1, 2]);
    // The rolled-back receives are no attempts of the table queue: message 1 ran once, first time.
    expect(log.calls[1]!.context.attempt).toBe(1);
    expect(new Set(log.calls.map((c) => c.context.conversationHandle)).size, 'one conversation throughout').toBe(1);
    expect(await suite.queueStatus(queue)).toMatchObject({ ReceiveEnabled: 1, PoisonHandling: 0 });
    // A BROKER_QUEUE_DISABLED event, if the task fired one, is cleared by the next check.
    await waitFor(
      () => again.health(name),
      (health) => health.status === 'up',
      { timeoutMs: 20_000, what: 'health up' },
    );
  });

  it('the control: the same five rolled-back receives disable a queue created with POISON_MESSAGE_HANDLING ON', async () => {
    const name = 'poisonon';
    const queue = suite.queue(name).queue;
    const queues = { [name]: {} };
    await mssqlRows(db.url, ENSURE_SCHEMA, (r) => r.input('schema', sql.NVarChar(128), suite.schema));
    await mssqlRows(db.url, createQueueWithPoisonHandling(queue));
    // The setup creates the rest around the existing queue, and warns about it.
    const logger = new CaptureLogger();
    const sender = await suite.boot({ queues, module: { consumer: { enabled: false } }, logger });
    expect(logger.matching(/POISON_MESSAGE_HANDLING \(STATUS = ON\)/).length).toBeGreaterThanOrEqual(1);
    expect(await suite.queueStatus(queue)).toEqual({ ReceiveEnabled: 1, EnqueueEnabled: 1, PoisonHandling: 1 });
    await sender.producer.send(name, { n: 1 }, { groupKey: 'on' });
    await queued(queue, 1, 'the message in the target queue');

    await suite.receiveAndRollBack(queue, 5);
    await waitFor(
      () => suite.receiveEnabled(name),
      (enabled) => enabled === 0,
      {
        what: "the queue disabled after five rollbacks with POISON_MESSAGE_HANDLING ON (if it never is, these rollbacks do not reach Service Broker's poison detection, and the test above with OFF proves nothing)",
      },
    );
    // Nothing held the queue: the disable got its schema lock, and no request is left waiting.
    await waitFor(
      () => schemaLockWaiters(queue),
      (waiters) => waiters.length === 0,
      { what: 'no schema-modification lock request waiting on the disabled queue' },
    );

    // Recovery: enable it; the message is still there and is handled once.
    await mssqlRows(db.url, enableQueue(queue));
    const log = new CallLog<Numbered>();
    await suite.boot({ queues, handlers: { [name]: log.handler() } });
    await waitFor(
      () => log.calls.length,
      (n) => n === 1,
      { what: 'the message once the queue is enabled again' },
    );
    expect(log.bodies()).toEqual([{ n: 1 }]);
  });

  for (const groupOnDead of ['continue', 'block'] as const satisfies readonly GroupOnDead[]) {
    it(`groupOnDead '${groupOnDead}': a handler that always fails makes a dead job after maxAttempts, listed decoded; the conversation is not ended and its later messages ${groupOnDead === 'continue' ? 'go on' : 'wait until it is retried or purged'}; retryDead runs it in its place, purgeDead removes it`, async () => {
      const name = `dead_${groupOnDead}`;
      const failing = new Set([1, 4]);
      const runs: { n: number; context: BrokerMessageContext }[] = [];
      const log = new CallLog<Numbered>();
      const { producer, events } = await suite.boot({
        queues: { [name]: { maxAttempts: 3, backoff: { type: 'fixed', delayMs: 50 }, groupOnDead } },
        handlers: {
          [name]: log.handler(async (body, context) => {
            runs.push({ n: body.n, context });
            if (failing.has(body.n)) throw new Error(`poison ${body.n} attempt ${context.attempt}`);
          }),
        },
      });
      const handled = (n: number) => log.calls.some((c) => c.body.n === n);
      const runsOf = (n: number) => runs.filter((r) => r.n === n);

      const { conversationHandle } = await producer.send(name, { n: 1 }, { groupKey: 'p' });
      expect(conversationHandle, 'the first send of a key opens its dialog').not.toBeNull();
      const page = await waitFor(
        () => producer.listDeadMessages(name),
        (found) => found.messages.length === 1,
        { what: 'message 1 dead after maxAttempts' },
      );
      expect(runsOf(1).map((r) => r.context.attempt)).toEqual([1, 2, 3]);
      const origin = runsOf(1)[0]!.context;
      const dead = page.messages[0]!;
      expect(dead).toMatchObject({
        id: origin.jobId,
        queue: name,
        conversationHandle: origin.conversationHandle,
        conversationGroupId: origin.conversationGroupId,
        messageSequenceNumber: origin.messageSequenceNumber,
        messageTypeName: suite.queue(name).messageType,
        body: { n: 1 },
        attempts: 3,
      });
      expect(dead.lastError).toContain('poison 1 attempt 3');
      expect(dead.deadAt).toBeInstanceOf(Date);
      // The events follow the statements that recorded the failures (a moment after them).
      const failedEvents = await waitFor(
        () => events.of('failed', name).map((e) => e.dead),
        (flags) => flags.length >= 3,
        { what: "message 1's three failed events" },
      );
      expect(failedEvents).toEqual([false, false, true]);
      // The same dead job through the table queue's own admin.
      expect((await producer.listDead(name)).jobs.map((job) => [job.id, job.state])).toEqual([[dead.id, 'dead']]);
      expect((await producer.brokerStats(name)).dead).toBe(1);

      // Not ended: both endpoints still converse, and the key's next message takes the same dialog.
      const bothConversing = (rows: readonly { State: string }[]) =>
        rows.length === 2 && rows.every((row) => row.State === 'CONVERSING');
      expect(await suite.endpointsOf(conversationHandle!), 'endpoints after the dead message').toSatisfy(
        bothConversing,
      );
      const second = await producer.send(name, { n: 2 }, { groupKey: 'p' });
      expect(second.conversationHandle, 'the same dialog').toBe(conversationHandle);

      if (groupOnDead === 'continue') {
        await waitFor(() => handled(2), Boolean, { what: 'message 2, after the dead message 1' });
      } else {
        await waitFor(
          () => events.moved(name),
          (moved) => moved >= 2,
          { what: 'message 2 moved into the table queue' },
        );
        const blocked = await waitFor(
          () => producer.listBlockedGroups(name),
          (found) => found.groups.length === 1,
          { what: "the conversation's group blocked by the dead message" },
        );
        expect(blocked.groups[0]!.jobId).toBe(dead.id);
        expect(blocked.groups[0]!.groupKey.toLowerCase()).toBe(origin.conversationGroupId.toLowerCase());
        expect((await producer.stats(name)).blockedGroups).toBe(1);
        // Another conversation is handled meanwhile; message 2, moved before it, still waits.
        await producer.send(name, { n: 3 }, { groupKey: 'other' });
        await waitFor(() => handled(3), Boolean, { what: 'message 3 of another conversation' });
        expect(handled(2), 'message 2 waits behind the dead message 1').toBe(false);
        expect(runsOf(2)).toEqual([]);
      }

      // retryDead: the healed handler runs message 1 again, in its conversation's place.
      failing.delete(1);
      expect(await producer.retryDead(name, [dead.id])).toEqual([dead.id]);
      await waitFor(() => handled(1) && handled(2), Boolean, { what: 'the retried message 1 and message 2' });
      const conversation = () =>
        log.calls.filter((c) => c.context.conversationHandle === origin.conversationHandle).map((c) => c.body.n);
      expect(conversation(), 'handled in the conversation').toEqual(groupOnDead === 'continue' ? [2, 1] : [1, 2]);
      expect((await producer.listDeadMessages(name)).messages).toEqual([]);

      // purgeDead: message 4 dies too; purged, it is gone, and message 5 is handled.
      await producer.send(name, { n: 4 }, { groupKey: 'p' });
      const fourth = await waitFor(
        () => producer.listDeadMessages(name),
        (found) => found.messages.length === 1,
        { what: 'message 4 dead after maxAttempts' },
      );
      expect(fourth.messages[0]).toMatchObject({ body: { n: 4 }, conversationHandle: origin.conversationHandle });
      await producer.send(name, { n: 5 }, { groupKey: 'p' });
      if (groupOnDead === 'continue') {
        await waitFor(() => handled(5), Boolean, { what: 'message 5, after the dead message 4' });
      } else {
        await waitFor(
          () => producer.listBlockedGroups(name),
          (found) => found.groups.length === 1,
          { what: 'the group blocked by message 4' },
        );
        await waitFor(
          () => events.moved(name),
          (moved) => moved >= 5,
          { what: 'message 5 moved into the table queue' },
        );
        expect(handled(5), 'message 5 waits behind the dead message 4').toBe(false);
      }
      expect(await producer.purgeDead(name, { ids: [fourth.messages[0]!.id] })).toBe(1);
      await waitFor(() => handled(5), Boolean, { what: 'message 5 after the purge' });
      expect((await producer.listDeadMessages(name)).messages).toEqual([]);
      expect((await producer.stats(name)).blockedGroups).toBe(0);
      expect(runsOf(4).map((r) => r.context.attempt)).toEqual([1, 2, 3]);

      // Every message of the conversation stayed on it, and it still converses.
      expect(conversation()).toEqual(groupOnDead === 'continue' ? [2, 1, 5] : [1, 2, 5]);
      expect(log.overlaps).toEqual([]);
      expect(await suite.endpointsOf(conversationHandle!), 'endpoints at the end').toSatisfy(bothConversing);
      expect(await suite.queueStatus(suite.queue(name).queue)).toMatchObject({ ReceiveEnabled: 1, PoisonHandling: 0 });
    });
  }

  it('after the rollbacks and the dead messages, no schema-modification lock request waits on any queue of the schema', async (context) => {
    if (!(await suite.canViewServerState())) {
      context.skip('reading sys.dm_tran_locks needs VIEW SERVER STATE, which the test login lacks');
    }
    const waiting = await mssqlRows<{ Session: number; Queue: string }>(db.url, SCHEMA_LOCK_WAITS_IN_SCHEMA, (r) =>
      r.input('schema', sql.NVarChar(128), suite.schema),
    );
    expect(waiting.map((w) => `session ${w.Session} waits for Sch-M on ${w.Queue}`)).toEqual([]);
  });
});
