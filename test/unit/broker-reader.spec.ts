import { describe, expect, it, vi } from 'vitest';
import { BROKER_SYSTEM } from '../../lib/src/broker/broker.names.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import { BROKER_CRASH_CAP, BrokerReader } from '../../lib/src/broker/broker.reader.js';
import * as Q from '../../lib/src/broker/broker.reader.queries.js';
import type {
  BrokerHandler,
  BrokerMessageContext,
  BrokerParams,
  ResolvedBrokerQueue,
} from '../../lib/src/broker/broker.types.js';
import { SqlQueueUnrecoverableError } from '../../lib/src/core/errors.js';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import { BrokerDriverDouble, brokerError } from '../helpers/broker-driver-double.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { FakeClock, settle } from '../helpers/fake-clock.js';

// The reader's transaction and poison logic against the recorded driver double, on a fake
// clock. The attempt journal is modelled in memory (the fake clock standing for the database
// clock), so the journal's decisions are the reader's to act on, as with a server.

const SCHEMA = 'sqlqueue';
const GROUP = '11111111-1111-1111-1111-111111111111';
const HANDLE = '22222222-2222-2222-2222-222222222222';
const OTHER_HANDLE = '33333333-3333-3333-3333-333333333333';
/** The resolved options of broker queue 'orders' in schema sqlqueue, with a linear test backoff and no time limit. */
function brokerQueue(overrides: Partial<ResolvedBrokerQueue> = {}): ResolvedBrokerQueue {
  const [queue] = resolveBrokerOptions({ queues: { orders: {} } }, SCHEMA)!.queues;
  return { ...queue!, retryDelay: (attempt) => 1_000 * attempt, maxDurationMs: null, ...overrides };
}

const { messageType: MESSAGE_TYPE, closeMessageType: CLOSE_TYPE } = brokerQueue();

interface JournalRow {
  attempts: number;
  failures: number;
  lastError: string | null;
  retryAt: number | null;
}

/** A received message as RECEIVE returns it; the body is JSON as UTF-16LE unless given. */
function message(sequence: number, body: unknown = { n: sequence }, overrides: Record<string, unknown> = {}) {
  return {
    conversation_group_id: GROUP,
    conversation_handle: HANDLE,
    message_sequence_number: String(sequence),
    message_type_name: MESSAGE_TYPE,
    message_body: Buffer.isBuffer(body) || body === null ? body : Buffer.from(JSON.stringify(body), 'utf16le'),
    ...overrides,
  };
}

function setup(
  options: { queue?: Partial<ResolvedBrokerQueue>; handler?: BrokerHandler; maxRetryWaitMs?: number } = {},
) {
  const queue = brokerQueue(options.queue);
  const double = new BrokerDriverDouble();
  const clock = new FakeClock();
  const logger = new CaptureLogger(false);
  const events: [string, unknown][] = [];
  const listener: QueueEventListener = {
    brokerHandled: (e) => events.push(['handled', e]),
    brokerFailed: (e) => events.push(['failed', e]),
    brokerDeadLettered: (e) => events.push(['dead', e]),
  };
  const handler = vi.fn<BrokerHandler>(options.handler ?? (async () => undefined));
  const reader = new BrokerReader({
    driver: double,
    schema: SCHEMA,
    queue,
    waitTimeoutMs: 5_000,
    handler,
    clock,
    logger,
    workerId: 'worker-1',
    listeners: [listener],
    maxRetryWaitMs: options.maxRetryWaitMs,
  });

  // The attempt journal, keyed by handle#sequence, with the fake clock as the database clock.
  const journal = new Map<string, JournalRow>();
  const keyOf = (p: BrokerParams) => `${String(p.handle!.value)}#${String(p.sequence!.value)}`;
  double.on(Q.journalAttempt(SCHEMA), (p) => {
    const key = keyOf(p);
    const row = journal.get(key) ?? { attempts: 0, failures: 0, lastError: null, retryAt: null };
    journal.set(key, row);
    const now = clock.now();
    if (row.retryAt !== null && row.retryAt > now) {
      return [{ ...journalOut(row), Journaled: false, RetryInMs: String(row.retryAt - now) }];
    }
    row.attempts++;
    return [{ ...journalOut(row), Journaled: true, RetryInMs: '0' }];
  });
  double.on(Q.journalFailure(SCHEMA), (p) => {
    const row = journal.get(keyOf(p))!;
    row.failures++;
    row.lastError = String(p.error!.value);
    row.retryAt = clock.now() + Number(p.delayMs!.value);
  });
  double.on(Q.journalRelease(SCHEMA), (p) => {
    const row = journal.get(keyOf(p))!;
    if (row.attempts > 0) row.attempts--;
  });
  double.on(Q.forgetMessage(SCHEMA), (p) => void journal.delete(keyOf(p)));
  double.on(Q.deadLetter(SCHEMA), (p) => void journal.delete(keyOf(p)));
  double.on(Q.drainConversationToDead(SCHEMA, queue.queue), () => [{ Moved: 0 }]);
  // Nothing more in the group unless a test queues messages.
  double.on(Q.receiveFromGroup(queue.queue), () => []);
  double.on(Q.waitForGroup(queue.queue), () => [{ conversation_group_id: null }]);

  /** The next WAITFOR finds the group, whose RECEIVEs return these messages in order. */
  const group = (...messages: ReturnType<typeof message>[]) => {
    double.once(Q.waitForGroup(queue.queue), () => [{ conversation_group_id: GROUP }]);
    for (const m of messages) double.once(Q.receiveFromGroup(queue.queue), () => [m]);
  };

  const names = new Map<string, string>([
    [Q.waitForGroup(queue.queue), 'WAITFOR GET CONVERSATION GROUP'],
    [Q.saveMessage(), 'SAVE TRANSACTION sq_message'],
    [Q.rollbackMessage(), 'ROLLBACK TRANSACTION sq_message'],
    [Q.receiveFromGroup(queue.queue), 'RECEIVE'],
    [Q.endConversation(), 'END CONVERSATION'],
    [Q.journalAttempt(SCHEMA), 'journalAttempt'],
    [Q.journalFailure(SCHEMA), 'journalFailure'],
    [Q.journalRelease(SCHEMA), 'journalRelease'],
    [Q.forgetMessage(SCHEMA), 'forgetMessage'],
    [Q.deadLetter(SCHEMA), 'deadLetter'],
    [Q.drainConversationToDead(SCHEMA, queue.queue), 'drainConversationToDead'],
  ]);
  const log = () => double.log((text) => names.get(text) ?? text);

  return { queue, double, clock, logger, events, handler, reader, journal, group, log };
}

function journalOut(row: JournalRow) {
  return { Attempts: row.attempts, Failures: row.failures, LastError: row.lastError };
}

const HANDLED_ONE = [
  'reader#1 SAVE TRANSACTION sq_message',
  'reader#1 RECEIVE',
  'autocommit journalAttempt',
  'reader#1 forgetMessage',
];

describe('BrokerReader: one transaction per runOnce', () => {
  it('a happy batch: WAITFOR, then per message SAVE, RECEIVE, journal, handler, forget; one COMMIT', async () => {
    const t = setup();
    t.group(message(1), message(2));
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.log()).toEqual([
      'reader#1 begin',
      'reader#1 WAITFOR GET CONVERSATION GROUP',
      ...HANDLED_ONE,
      ...HANDLED_ONE,
      'reader#1 SAVE TRANSACTION sq_message',
      'reader#1 RECEIVE',
      'reader#1 commit',
    ]);
    expect(t.handler.mock.calls.map(([body]) => body)).toEqual([{ n: 1 }, { n: 2 }]);
    const context = t.handler.mock.calls[0]![1];
    expect(context).toMatchObject({
      queue: 'orders',
      conversationHandle: HANDLE,
      conversationGroupId: GROUP,
      messageTypeName: MESSAGE_TYPE,
      messageSequenceNumber: '1',
      attempt: 1,
      maxAttempts: 5,
    } satisfies Omit<BrokerMessageContext, 'signal'>);
    expect(context.signal.aborted).toBe(false);
    expect(t.double.paramsOf(Q.waitForGroup(t.queue.queue))).toEqual({ timeoutMs: { type: 'int', value: 5_000 } });
    expect(t.double.paramsOf(Q.receiveFromGroup(t.queue.queue))).toEqual({
      group: { type: 'uniqueidentifier', value: GROUP },
    });
    expect(t.double.paramsOf(Q.journalAttempt(SCHEMA), 0)).toEqual({
      queue: { type: 'nvarchar', value: 'orders' },
      handle: { type: 'uniqueidentifier', value: HANDLE },
      sequence: { type: 'bigint', value: '1' },
      workerId: { type: 'nvarchar', value: 'worker-1' },
    });
    expect(t.events.map(([name]) => name)).toEqual(['handled', 'handled']);
    expect(t.journal.size).toBe(0);
    t.double.assertDiscipline({ allEnded: true });
  });

  it('stops after messagesPerTransaction messages and commits', async () => {
    const t = setup({ queue: { messagesPerTransaction: 2 } });
    t.group(message(1), message(2), message(3));
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.handler).toHaveBeenCalledTimes(2);
    expect(t.log().at(-1)).toBe('reader#1 commit');
    expect(t.log().filter((l) => l.endsWith('RECEIVE'))).toHaveLength(2);
  });

  it('an empty WAITFOR commits and returns empty', async () => {
    const t = setup();
    expect(await t.reader.runOnce()).toBe('empty');
    expect(t.log()).toEqual(['reader#1 begin', 'reader#1 WAITFOR GET CONVERSATION GROUP', 'reader#1 commit']);
    t.double.assertDiscipline({ allEnded: true });
  });

  it('a group with nothing left to receive commits and returns empty', async () => {
    const t = setup();
    t.group();
    expect(await t.reader.runOnce()).toBe('empty');
    expect(t.log().at(-1)).toBe('reader#1 commit');
  });
});

describe('BrokerReader: handler failures use the savepoint, never a full rollback', () => {
  it('a handler error: ROLLBACK TRANSACTION sq_message, journalFailure, COMMIT; the earlier success commits', async () => {
    const t = setup({
      handler: async (body) => {
        if ((body as { n: number }).n === 2) throw new Error('boom');
      },
    });
    t.group(message(1), message(2), message(3));
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.log()).toEqual([
      'reader#1 begin',
      'reader#1 WAITFOR GET CONVERSATION GROUP',
      ...HANDLED_ONE,
      'reader#1 SAVE TRANSACTION sq_message',
      'reader#1 RECEIVE',
      'autocommit journalAttempt',
      'reader#1 ROLLBACK TRANSACTION sq_message',
      'autocommit journalFailure',
      'reader#1 commit',
    ]);
    // The batch stopped: message 3 was never received (message 2 is first in its conversation again).
    expect(t.handler).toHaveBeenCalledTimes(2);
    expect(t.double.paramsOf(Q.journalFailure(SCHEMA))).toMatchObject({
      sequence: { type: 'bigint', value: '2' },
      error: { type: 'nvarchar', value: 'boom' },
      delayMs: { type: 'int', value: 1_000 },
    });
    expect(t.journal.get(`${HANDLE}#2`)).toEqual({ attempts: 1, failures: 1, lastError: 'boom', retryAt: 1_000 });
    expect(t.events).toEqual([
      ['handled', { queue: 'orders', attempt: 1, durationMs: 0 }],
      ['failed', { queue: 'orders', attempt: 1, dead: false, error: 'boom' }],
    ]);
    expect(t.double.calls.some((c) => c.kind === 'rollback')).toBe(false);
    t.double.assertDiscipline({ allEnded: true });
  });

  it('a run past maxDurationMs fails (its signal aborts) and takes the savepoint path', async () => {
    let signal: AbortSignal | undefined;
    const t = setup({
      queue: { maxDurationMs: 60_000 },
      handler: (_body, context) => {
        signal = context.signal;
        return new Promise<void>(() => undefined);
      },
    });
    t.group(message(1));
    const run = t.reader.runOnce();
    await t.clock.advance(59_999);
    expect(t.reader.busy).toBe(true);
    await t.clock.advance(1);
    expect(await run).toBe('handled');
    expect(signal?.aborted).toBe(true);
    expect(t.log().slice(-3)).toEqual([
      'reader#1 ROLLBACK TRANSACTION sq_message',
      'autocommit journalFailure',
      'reader#1 commit',
    ]);
    expect(String(t.double.paramsOf(Q.journalFailure(SCHEMA)).error!.value)).toMatch(/exceeded maxDurationMs=60000/);
  });

  it('the last allowed run fails: the message in hand goes to the dead table at once', async () => {
    const t = setup({
      handler: async () => {
        throw new Error('still broken');
      },
    });
    t.journal.set(`${HANDLE}#1`, { attempts: 4, failures: 4, lastError: 'broken', retryAt: null });
    t.group(message(1));
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.handler).toHaveBeenCalledTimes(1);
    expect(t.log().slice(2)).toEqual([
      'reader#1 SAVE TRANSACTION sq_message',
      'reader#1 RECEIVE',
      'autocommit journalAttempt',
      'reader#1 deadLetter',
      'reader#1 drainConversationToDead',
      'reader#1 SAVE TRANSACTION sq_message',
      'reader#1 RECEIVE',
      'reader#1 commit',
    ]);
    expect(t.double.paramsOf(Q.deadLetter(SCHEMA))).toMatchObject({
      attempts: { type: 'int', value: 5 },
      crashes: { type: 'int', value: 0 },
      lastError: { type: 'nvarchar', value: 'still broken' },
      reason: { type: 'nvarchar', value: 'max-attempts' },
      body: { type: 'varbinary', value: message(1).message_body },
    });
    expect(t.events).toEqual([
      ['failed', { queue: 'orders', attempt: 5, dead: true, error: 'still broken' }],
      ['dead', { queue: 'orders', reason: 'max-attempts', count: 1 }],
    ]);
  });

  it('an unrecoverable error goes to the dead table on its first run', async () => {
    const t = setup({
      handler: async () => {
        throw new SqlQueueUnrecoverableError('bad order');
      },
    });
    t.group(message(1));
    await t.reader.runOnce();
    expect(t.double.paramsOf(Q.deadLetter(SCHEMA))).toMatchObject({
      attempts: { type: 'int', value: 1 },
      reason: { type: 'nvarchar', value: 'max-attempts' },
      lastError: { type: 'nvarchar', value: 'bad order' },
    });
  });
});

describe('BrokerReader: poison messages never reach five rollbacks', () => {
  it('attempts used up (journal over maxAttempts): dead-lettered without running the handler', async () => {
    const t = setup();
    t.journal.set(`${HANDLE}#1`, { attempts: 5, failures: 5, lastError: 'boom', retryAt: null });
    t.double.on(Q.drainConversationToDead(SCHEMA, t.queue.queue), () => [{ Moved: 2 }]);
    t.group(message(1));
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.handler).not.toHaveBeenCalled();
    expect(t.double.paramsOf(Q.deadLetter(SCHEMA))).toMatchObject({
      queue: { type: 'nvarchar', value: 'orders' },
      handle: { type: 'uniqueidentifier', value: HANDLE },
      group: { type: 'uniqueidentifier', value: GROUP },
      sequence: { type: 'bigint', value: '1' },
      messageType: { type: 'nvarchar', value: MESSAGE_TYPE },
      attempts: { type: 'int', value: 5 },
      crashes: { type: 'int', value: 0 },
      lastError: { type: 'nvarchar', value: 'boom' },
      reason: { type: 'nvarchar', value: 'max-attempts' },
    });
    const drain = t.double.paramsOf(Q.drainConversationToDead(SCHEMA, t.queue.queue));
    expect(drain).toMatchObject({
      handle: { type: 'uniqueidentifier', value: HANDLE },
      messageType: { type: 'nvarchar', value: MESSAGE_TYPE },
      code: { type: 'int', value: Q.BROKER_DEAD_LETTER_ERROR_CODE },
    });
    expect(String(drain.description!.value)).toMatch(
      /message 1 was moved to the dead table \(max-attempts after 5 runs\): boom/,
    );
    expect(t.events).toEqual([
      ['dead', { queue: 'orders', reason: 'max-attempts', count: 1 }],
      ['dead', { queue: 'orders', reason: 'conversation-ended', count: 2 }],
    ]);
    expect(t.log().at(-1)).toBe('reader#1 commit');
    expect(t.double.calls.some((c) => c.kind === 'rollback')).toBe(false);
  });

  it(`crash cap: journal at Attempts 5, Failures 0 → dead ('crashes') without the handler, even with maxAttempts 10`, async () => {
    const t = setup({ queue: { maxAttempts: 10 } });
    // Four runs started and never recorded an outcome; journalAttempt makes this the fifth.
    t.journal.set(`${HANDLE}#1`, { attempts: 4, failures: 0, lastError: null, retryAt: null });
    t.group(message(1));
    await t.reader.runOnce();
    expect(BROKER_CRASH_CAP).toBe(4);
    expect(t.handler).not.toHaveBeenCalled();
    expect(t.double.paramsOf(Q.deadLetter(SCHEMA))).toMatchObject({
      attempts: { type: 'int', value: 4 },
      crashes: { type: 'int', value: 4 },
      reason: { type: 'nvarchar', value: 'crashes' },
    });
    expect(String(t.double.paramsOf(Q.deadLetter(SCHEMA)).lastError!.value)).toMatch(/4 runs ended without an outcome/);
  });

  it('a message with a crash on record runs alone: its neighbours commit first and then clear their own', async () => {
    const t = setup({ queue: { maxAttempts: 10 } });
    // A crash mid-batch undid message 1's recorded success too: both show one run without an outcome.
    t.journal.set(`${HANDLE}#1`, { attempts: 1, failures: 0, lastError: null, retryAt: null });
    t.journal.set(`${HANDLE}#2`, { attempts: 1, failures: 0, lastError: null, retryAt: null });
    t.group(message(1), message(2));
    expect(await t.reader.runOnce()).toBe('handled');
    // Message 1 ran alone and committed; message 2 was not received in that transaction.
    expect(t.handler.mock.calls.map(([body]) => body)).toEqual([{ n: 1 }]);
    expect(t.journal.has(`${HANDLE}#1`)).toBe(false);
    expect(t.log().slice(-2)).toEqual(['reader#1 forgetMessage', 'reader#1 commit']);
  });

  it('a suspect received after a success is given back (its run not counted) and the success commits', async () => {
    const t = setup({ queue: { maxAttempts: 10 } });
    t.journal.set(`${HANDLE}#2`, { attempts: 1, failures: 0, lastError: null, retryAt: null });
    t.group(message(1), message(2));
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.handler.mock.calls.map(([body]) => body)).toEqual([{ n: 1 }]);
    expect(t.journal.get(`${HANDLE}#2`)).toMatchObject({ attempts: 1, failures: 0 });
    expect(t.log().slice(-5)).toEqual([
      'reader#1 RECEIVE',
      'autocommit journalAttempt',
      'reader#1 ROLLBACK TRANSACTION sq_message',
      'autocommit journalRelease',
      'reader#1 commit',
    ]);
    expect(t.double.calls.some((c) => c.kind === 'rollback')).toBe(false);
  });

  it('crash loop of a batch: the crashes land on the message that causes them, not on the first one', async () => {
    // Message 3 of a 3-message conversation kills its process: modelled as a transaction that
    // never commits (the journal keeps every run started in it; its forgets are undone).
    const t = setup({ queue: { maxAttempts: 10 } });
    const delivered = new Set<number>();
    let crashes = 0;
    for (let round = 0; round < 8 && crashes < 10; round++) {
      const pending = [1, 2, 3].filter((n) => !delivered.has(n));
      if (pending.length === 0) break;
      t.group(...pending.map((n) => message(n)));
      const handledHere: number[] = [];
      const journalBefore = new Map([...t.journal].map(([k, v]) => [k, { ...v }]));
      t.handler.mockImplementation(async (body) => {
        const n = (body as { n: number }).n;
        if (n === 3) throw Object.assign(new Error('process killed'), { crash: true });
        handledHere.push(n);
      });
      try {
        await t.reader.runOnce();
        for (const n of handledHere) delivered.add(n);
      } catch {
        // not reached: handler errors take the savepoint path
      }
      // A real crash would have ended the transaction without a commit: undo this round's forgets
      // and failure records the way a full rollback plus a dead process would.
      if (t.handler.mock.calls.some(([body]) => (body as { n: number }).n === 3)) {
        crashes++;
        for (const [k, v] of journalBefore) if (!t.journal.has(k) && !k.endsWith('#3')) t.journal.set(k, v);
        for (const n of handledHere) {
          delivered.delete(n);
          const key = `${HANDLE}#${n}`;
          const row = t.journal.get(key) ?? { attempts: 0, failures: 0, lastError: null, retryAt: null };
          row.attempts = (journalBefore.get(key)?.attempts ?? 0) + 1;
          t.journal.set(key, row);
        }
        const three = t.journal.get(`${HANDLE}#3`)!;
        three.failures = journalBefore.get(`${HANDLE}#3`)?.failures ?? 0;
        three.retryAt = null;
      }
      t.handler.mockClear();
    }
    const dead = t.double.calls.filter((c) => c.kind === 'query' && c.text === Q.deadLetter(SCHEMA));
    expect(dead).toHaveLength(1);
    expect(dead[0]!.kind === 'query' && dead[0]!.params.sequence).toEqual({ type: 'bigint', value: '3' });
    expect(dead[0]!.kind === 'query' && dead[0]!.params.reason).toEqual({ type: 'nvarchar', value: 'crashes' });
  });

  it('three crashes and recorded failures between them still run the handler', async () => {
    const t = setup({ queue: { maxAttempts: 10 } });
    t.journal.set(`${HANDLE}#1`, { attempts: 6, failures: 3, lastError: 'x', retryAt: null });
    t.group(message(1));
    await t.reader.runOnce();
    expect(t.handler).toHaveBeenCalledTimes(1);
    expect(t.handler.mock.calls[0]![1].attempt).toBe(7);
  });

  it('a body that does not parse as JSON goes to the dead table: it never will parse', async () => {
    const t = setup();
    t.group(message(1, Buffer.from('{not json', 'utf16le')));
    await t.reader.runOnce();
    expect(t.handler).not.toHaveBeenCalled();
    const dead = t.double.paramsOf(Q.deadLetter(SCHEMA));
    expect(dead).toMatchObject({
      reason: { type: 'nvarchar', value: 'max-attempts' },
      attempts: { type: 'int', value: 1 },
    });
    expect(String(dead.lastError!.value)).toMatch(/not JSON.*format 'json'/);
  });

  it('accepts UTF-8 and UTF-16 with a BOM as JSON too', async () => {
    const t = setup();
    t.group(
      message(1, Buffer.from('{"n":"utf8 é"}', 'utf8')),
      message(2, Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('{"n":"bom"}', 'utf16le')])),
    );
    await t.reader.runOnce();
    expect(t.handler.mock.calls.map(([body]) => body)).toEqual([{ n: 'utf8 é' }, { n: 'bom' }]);
  });
});

describe('BrokerReader: system messages and the close handshake', () => {
  it('EndDialog, Error and Close end our side; DialogTimer is dropped; the handler sees none of them', async () => {
    const t = setup();
    const errorBody = Buffer.concat([
      Buffer.from([0xff, 0xfe]),
      Buffer.from(
        '<Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error"><Code>-8489</Code><Description>The dialog has exceeded the specified LIFETIME.</Description></Error>',
        'utf16le',
      ),
    ]);
    t.group(
      message(1, null, { message_type_name: BROKER_SYSTEM.DIALOG_TIMER }),
      message(2, null, { message_type_name: BROKER_SYSTEM.END_DIALOG }),
      message(1, errorBody, { message_type_name: BROKER_SYSTEM.ERROR, conversation_handle: OTHER_HANDLE }),
      message(3, null, { message_type_name: CLOSE_TYPE }),
    );
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.handler).not.toHaveBeenCalled();
    const ends = t.double.calls.filter((c) => c.kind === 'query' && c.text === Q.endConversation());
    expect(ends.map((c) => (c.kind === 'query' ? c.params.handle!.value : null))).toEqual([
      HANDLE,
      OTHER_HANDLE,
      HANDLE,
    ]);
    expect(t.double.statements('autocommit')).toEqual([]);
    expect(
      t.logger.matching(/ended with an error from the other side \(code -8489: The dialog has exceeded/),
    ).toHaveLength(1);
    expect(t.log().at(-1)).toBe('reader#1 commit');
  });
});

describe('BrokerReader: retries wait holding the group', () => {
  it('RetryAt in the future: ROLLBACK to the savepoint, wait on the clock, then run it', async () => {
    const t = setup();
    t.journal.set(`${HANDLE}#1`, { attempts: 1, failures: 1, lastError: 'boom', retryAt: 3_000 });
    t.group(message(1), message(1));
    const run = t.reader.runOnce();
    await settle();
    expect(t.handler).not.toHaveBeenCalled();
    expect(t.log().slice(2)).toEqual([
      'reader#1 SAVE TRANSACTION sq_message',
      'reader#1 RECEIVE',
      'autocommit journalAttempt',
      'reader#1 ROLLBACK TRANSACTION sq_message',
    ]);
    await t.clock.advance(2_999);
    expect(t.handler).not.toHaveBeenCalled();
    await t.clock.advance(1);
    expect(await run).toBe('handled');
    expect(t.handler).toHaveBeenCalledTimes(1);
    expect(t.handler.mock.calls[0]![1].attempt).toBe(2);
    expect(t.log().slice(6)).toEqual([
      ...HANDLED_ONE,
      'reader#1 SAVE TRANSACTION sq_message',
      'reader#1 RECEIVE',
      'reader#1 commit',
    ]);
  });

  it('a retry not due after messages were handled: give it back and commit, no wait', async () => {
    const t = setup();
    t.journal.set(`${HANDLE}#2`, { attempts: 1, failures: 1, lastError: 'boom', retryAt: 3_000 });
    t.group(message(1), message(2));
    expect(await t.reader.runOnce()).toBe('handled');
    expect(t.handler).toHaveBeenCalledTimes(1);
    expect(t.log().slice(-3)).toEqual([
      'autocommit journalAttempt',
      'reader#1 ROLLBACK TRANSACTION sq_message',
      'reader#1 commit',
    ]);
  });

  it('a retry further away than maxRetryWaitMs: waits that long, then lets the group go', async () => {
    const t = setup({ maxRetryWaitMs: 2_000 });
    t.journal.set(`${HANDLE}#1`, { attempts: 1, failures: 1, lastError: 'boom', retryAt: 60_000 });
    t.group(message(1));
    const run = t.reader.runOnce();
    await t.clock.advance(1_999);
    expect(t.log().at(-1)).toBe('reader#1 ROLLBACK TRANSACTION sq_message');
    await t.clock.advance(1);
    expect(await run).toBe('handled');
    expect(t.log().at(-1)).toBe('reader#1 commit');
    expect(t.handler).not.toHaveBeenCalled();
  });
});

describe('BrokerReader: stop()', () => {
  it('during the WAITFOR: cancels it, commits, returns stopped; later runs start nothing', async () => {
    const t = setup();
    const wait = t.double.hold(Q.waitForGroup(t.queue.queue));
    const run = t.reader.runOnce();
    await wait.reached;
    const stopped = t.reader.stop({ abortAfterMs: 1_000 });
    expect(await run).toBe('stopped');
    await stopped;
    expect(t.log()).toEqual([
      'reader#1 begin',
      'reader#1 WAITFOR GET CONVERSATION GROUP',
      'reader#1 cancel',
      'reader#1 commit',
    ]);
    expect(await t.reader.runOnce()).toBe('stopped');
    expect(t.double.sessions).toHaveLength(1);
    t.double.assertDiscipline({ allEnded: true });
  });

  it('a WAITFOR that returned a group as stop() came: commits without receiving', async () => {
    const t = setup();
    const wait = t.double.hold(Q.waitForGroup(t.queue.queue));
    const run = t.reader.runOnce();
    await wait.reached;
    wait.release([{ conversation_group_id: GROUP }]);
    void t.reader.stop();
    expect(await run).toBe('stopped');
    expect(t.double.statements('reader')).toEqual([Q.waitForGroup(t.queue.queue)]);
    expect(t.log().at(-1)).toBe('reader#1 commit');
  });

  it('during a handler: waits for it; a handler that finishes commits its message', async () => {
    let finish!: () => void;
    const t = setup({ handler: () => new Promise<void>((resolve) => (finish = resolve)) });
    t.group(message(1), message(2));
    const run = t.reader.runOnce();
    await settle();
    expect(t.reader.busy).toBe(true);
    let stopped = false;
    const stopping = t.reader.stop({ abortAfterMs: 10_000 }).then(() => (stopped = true));
    await t.clock.advance(5_000);
    expect(stopped).toBe(false);
    finish();
    expect(await run).toBe('stopped');
    await stopping;
    expect(t.handler).toHaveBeenCalledTimes(1);
    expect(t.log().slice(-2)).toEqual(['reader#1 forgetMessage', 'reader#1 commit']);
    expect(t.double.calls.some((c) => c.kind === 'cancel')).toBe(false);
  });

  it('during a handler: aborts its signal after abortAfterMs; the run is given back, not failed', async () => {
    let signal!: AbortSignal;
    const t = setup({
      handler: (_body, context) =>
        new Promise<void>((_, reject) => {
          signal = context.signal;
          context.signal.addEventListener('abort', () => reject(context.signal.reason));
        }),
    });
    t.group(message(1));
    const run = t.reader.runOnce();
    await settle();
    void t.reader.stop({ abortAfterMs: 1_000 });
    await t.clock.advance(999);
    expect(signal.aborted).toBe(false);
    await t.clock.advance(1);
    expect(signal.aborted).toBe(true);
    expect(await run).toBe('stopped');
    expect(t.log().slice(-4)).toEqual([
      'autocommit journalAttempt',
      'reader#1 ROLLBACK TRANSACTION sq_message',
      'autocommit journalRelease',
      'reader#1 commit',
    ]);
    expect(t.journal.get(`${HANDLE}#1`)).toMatchObject({ attempts: 0, failures: 0 });
    expect(t.events).toEqual([]);
  });

  it('while waiting for a retry: the wait ends and the transaction commits', async () => {
    const t = setup();
    t.journal.set(`${HANDLE}#1`, { attempts: 1, failures: 1, lastError: 'boom', retryAt: 3_000 });
    t.group(message(1));
    const run = t.reader.runOnce();
    await settle();
    await t.reader.stop();
    expect(await run).toBe('stopped');
    expect(t.log().slice(-2)).toEqual(['reader#1 ROLLBACK TRANSACTION sq_message', 'reader#1 commit']);
  });
});

describe('BrokerReader: a failure of our own statements', () => {
  it('returns the message in hand, commits the rest, and rejects', async () => {
    const t = setup();
    t.group(message(1), message(2));
    t.double.once(Q.forgetMessage(SCHEMA), () => undefined);
    t.double.once(Q.forgetMessage(SCHEMA), () => {
      throw brokerError(1222, 'Lock request time out period exceeded.');
    });
    const error = await t.reader.runOnce().catch((e: unknown) => e);
    expect(t.double.errorNumber(error)).toBe(1222);
    expect(t.log().slice(-3)).toEqual([
      'reader#1 forgetMessage',
      'reader#1 ROLLBACK TRANSACTION sq_message',
      'reader#1 commit',
    ]);
    t.double.assertDiscipline({ allEnded: true });
  });

  it('the journal (another connection) failing: the message goes back before the handler runs', async () => {
    const t = setup();
    t.group(message(1));
    t.double.once(Q.journalAttempt(SCHEMA), () => {
      throw brokerError(-2, 'Timeout: Request failed to complete in 15000ms');
    });
    await expect(t.reader.runOnce()).rejects.toThrow(/Timeout/);
    expect(t.handler).not.toHaveBeenCalled();
    expect(t.log().slice(-2)).toEqual(['reader#1 ROLLBACK TRANSACTION sq_message', 'reader#1 commit']);
  });

  it('a doomed transaction: rolled back (reported), and runOnce rejects with the first error', async () => {
    const t = setup();
    t.group(message(1));
    t.double.once(Q.forgetMessage(SCHEMA), () => {
      throw brokerError(1205, 'deadlock victim', { dooms: true });
    });
    const error = await t.reader.runOnce().catch((e: unknown) => e);
    expect(t.double.errorNumber(error)).toBe(1205);
    expect(t.log().slice(-2)).toEqual(['reader#1 ROLLBACK TRANSACTION sq_message', 'reader#1 rollback']);
    expect(t.logger.matching(/could not be committed .* it was rolled back/)).toHaveLength(1);
    t.double.assertDiscipline({ allEnded: true });
  });

  it('a failing WAITFOR (queue disabled): commits and rejects', async () => {
    const t = setup();
    t.double.once(Q.waitForGroup(t.queue.queue), () => {
      throw brokerError(9617, 'The service queue is currently disabled.');
    });
    await expect(t.reader.runOnce()).rejects.toThrow(/disabled/);
    expect(t.log()).toEqual(['reader#1 begin', 'reader#1 WAITFOR GET CONVERSATION GROUP', 'reader#1 commit']);
  });

  it('a second runOnce while one runs is refused', async () => {
    const t = setup();
    const wait = t.double.hold(Q.waitForGroup(t.queue.queue));
    const run = t.reader.runOnce();
    await wait.reached;
    await expect(t.reader.runOnce()).rejects.toThrow(/already running/);
    wait.release([{ conversation_group_id: null }]);
    expect(await run).toBe('empty');
  });
});

describe('BrokerReader: statements it sends', () => {
  it('every Service Broker statement starts its batch or follows a statement ended by ;', async () => {
    const t = setup({
      handler: async (body) => {
        if ((body as { n: number }).n === 2) throw new Error('boom');
      },
    });
    t.journal.set(`${HANDLE}#3`, { attempts: 9, failures: 9, lastError: 'x', retryAt: null });
    t.group(message(3), message(1), message(4, null, { message_type_name: BROKER_SYSTEM.END_DIALOG }), message(2));
    await t.reader.runOnce();
    const texts = new Set(t.double.calls.flatMap((c) => (c.kind === 'query' ? [c.text] : [])));
    expect(texts.size).toBeGreaterThanOrEqual(9);
    const broker = /\b(WAITFOR\s*\(|RECEIVE\s|GET\s+CONVERSATION\s+GROUP|END\s+CONVERSATION)/g;
    for (const text of texts) {
      for (const m of text.matchAll(broker)) {
        if (/WAITFOR\s*\(\s*$/.test(text.slice(0, m.index))) continue;
        const before = text.slice(0, m.index).trimEnd();
        expect(before === '' || before.endsWith(';'), text).toBe(true);
      }
    }
  });
});
