import { describe, expect, it } from 'vitest';
import { encodeBrokerBody } from '../../lib/src/broker/broker.body.js';
import {
  brokerDeadMessage,
  brokerJobHandler,
  type BrokerJobPayload,
  BROKER_JOB_FIELDS,
  BROKER_MOVE_MAX_KEPT_BYTES,
} from '../../lib/src/broker/reader/broker.job.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import type { BrokerMessageContext, BrokerBodyFormat } from '../../lib/src/broker/broker.types.js';
import { SqlQueueUnrecoverableError } from '../../lib/src/core/errors.js';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
import type { JobRecord } from '../../lib/src/core/types.js';
import { brokerJobPayload } from '../helpers/pg-broker-double.js';
import { deadJobRecord } from '../helpers/job-records.js';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../../lib/src/core/validation.js';
import { BROKER_HANDLER_DEFAULTS } from '../../lib/src/broker/broker.options.js';
import {
  MIGRATED_BODY_MAX_BYTES,
  MIGRATED_MAX_ATTEMPTS,
  MSSQL_MIGRATIONS,
} from '../../lib/src/store/mssql/mssql.migrations.js';

const HANDLE = '6F9619FF-8B86-D011-B42D-00C04FC964FF';
const GROUP = '7A9619FF-8B86-D011-B42D-00C04FC964FF';

function queueOf(format: BrokerBodyFormat) {
  return resolveBrokerOptions({ queues: { orders: { format } } }, 'sqlqueue')!.queues[0]!;
}

/** A job context as the consumer builds it: `signal` is a getter, created on first use. */
function jobContext(): JobContext & { signalReads: number } {
  let reads = 0;
  const controller = new AbortController();
  return {
    jobId: '42',
    queue: 'orders',
    attempt: 2,
    maxAttempts: 5,
    idempotencyKey: null,
    groupKey: GROUP,
    schedule: null,
    enqueuedAt: new Date(0),
    claimedAt: new Date(1),
    get signal() {
      reads++;
      return controller.signal;
    },
    extendLease: async () => undefined,
    progress: () => undefined,
    rateLimited: () => undefined,
    transaction: null,
    get signalReads() {
      return reads;
    },
  };
}

function message(format: BrokerBodyFormat, body: unknown, over: Partial<BrokerJobPayload> = {}): BrokerJobPayload {
  const queue = queueOf(format);
  const bytes = body === null ? null : encodeBrokerBody(format, body, 1 << 20, 'test');
  return {
    ...brokerJobPayload(queue, { type: queue.messageType, handle: HANDLE, group: GROUP, sequence: 3n, body: bytes }),
    ...over,
  };
}

async function run(format: BrokerBodyFormat, payload: unknown) {
  const calls: { body: unknown; context: BrokerMessageContext }[] = [];
  const ended: string[] = [];
  const handler = brokerJobHandler({
    maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
    queue: queueOf(format),
    handler: async (body, context) => void calls.push({ body, context }),
    endConversation: async (handle) => void ended.push(handle),
  });
  const context = jobContext();
  await handler(payload, context);
  return { calls, ended, context };
}

describe('a moved message as a job: its payload and its handler', () => {
  it("hands a 'json' body sent by send() to the handler parsed, with the job's context and the message's origin", async () => {
    const payload = message('json', { order: 7, lines: ['a', 'é'] });
    // What the move writes for send()'s UTF-16LE JSON: the text itself, readable in the dashboard.
    expect(payload.text).toBe('{"order":7,"lines":["a","é"]}');
    expect(payload.body).toBeUndefined();
    const { calls, context } = await run('json', payload);
    expect(calls).toHaveLength(1);
    expect(calls[0]!.body).toEqual({ order: 7, lines: ['a', 'é'] });
    const c = calls[0]!.context;
    expect([c.jobId, c.queue, c.attempt, c.maxAttempts, c.groupKey]).toEqual(['42', 'orders', 2, 5, GROUP]);
    expect([c.conversationHandle, c.conversationGroupId, c.messageSequenceNumber, c.messageTypeName]).toEqual([
      HANDLE,
      GROUP,
      '3',
      queueOf('json').messageType,
    ]);
    // The signal stays the job's own, and lazy: the wrapper did not read it.
    expect(context.signalReads).toBe(0);
    expect(c.signal).toBe(context.signal);
    expect(typeof c.extendLease).toBe('function');
  });

  it('decodes bodies moved as bytes: UTF-8 JSON from a T-SQL producer, raw bytes, XML, and no body', async () => {
    const utf8 = { ...message('json', null), body: Buffer.from('{"a":1}', 'utf8').toString('base64') };
    expect((await run('json', utf8)).calls[0]!.body).toEqual({ a: 1 });
    const raw = message('raw', Buffer.from([0, 1, 2, 255]));
    expect(raw.text).toBeUndefined();
    expect((await run('raw', raw)).calls[0]!.body).toEqual(Buffer.from([0, 1, 2, 255]));
    const xml = message('xml', '<a>é</a>');
    expect((await run('xml', xml)).calls[0]!.body).toBe('<a>é</a>');
    expect((await run('json', message('json', null))).calls[0]!.body).toBeNull();
    expect((await run('raw', message('raw', null))).calls[0]!.body).toEqual(Buffer.alloc(0));
    expect((await run('xml', message('xml', null))).calls[0]!.body).toBe('');
  });

  it('a Close message ends its conversation and never reaches the handler', async () => {
    const queue = queueOf('json');
    const { calls, ended } = await run('json', { ...message('json', null), type: queue.closeMessageType });
    expect(calls).toEqual([]);
    expect(ended).toEqual([HANDLE]);
  });

  it('fails as unrecoverable (the job goes dead at once) for a body that does not decode, a dropped body or a foreign payload', async () => {
    const bad = { ...message('json', null), text: '{"order":' };
    await expect(run('json', bad)).rejects.toThrow(SqlQueueUnrecoverableError);
    await expect(run('json', bad)).rejects.toThrow(
      /broker queue 'orders': message body is not JSON.*\(format 'json'\)/,
    );
    const dropped = { ...message('raw', null), droppedBytes: DEFAULT_MAX_PAYLOAD_BYTES + 1 };
    await expect(run('raw', dropped)).rejects.toThrow(
      /is 1048577 bytes, more than a move keeps \(maxPayloadBytes, 1048576\); it was not kept/,
    );
    await expect(run('json', { order: 7 })).rejects.toThrow(
      /job 42 in broker queue 'orders' does not carry a received message/,
    );
    await expect(run('json', { ...message('json', null), sequence: 3 })).rejects.toThrow(SqlQueueUnrecoverableError);
  });

  it("a handler error is the job's failure, as thrown", async () => {
    const handler = brokerJobHandler({
      maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      queue: queueOf('json'),
      handler: async () => {
        throw new TypeError('payment service down');
      },
      endConversation: async () => undefined,
    });
    await expect(handler(message('json', { a: 1 }), jobContext())).rejects.toThrow(TypeError);
  });
});

describe('a dead job of a broker queue as a dead message', () => {
  const job = (payload: unknown): JobRecord =>
    deadJobRecord({ id: '9', queue: 'orders', payload, groupKey: GROUP, finishedAt: new Date(5) });

  it('decodes the body, or lists the bytes of one that does not decode', () => {
    expect(brokerDeadMessage(queueOf('json'), job(message('json', { a: 1 })))).toEqual({
      id: '9',
      queue: 'orders',
      conversationHandle: HANDLE,
      conversationGroupId: GROUP,
      messageSequenceNumber: '3',
      messageTypeName: queueOf('json').messageType,
      body: { a: 1 },
      attempts: 5,
      lastError: 'boom',
      deadAt: new Date(5),
      droppedBytes: null,
    });
    const bad = { ...message('json', null), text: '{oops' };
    expect(brokerDeadMessage(queueOf('json'), job(bad)).body).toEqual(Buffer.from('{oops', 'utf16le'));
    // A body too large to keep: listed by its size, with no body.
    const dropped = { ...message('raw', null), droppedBytes: 70_000_000 };
    expect(brokerDeadMessage(queueOf('raw'), job(dropped))).toMatchObject({ body: null, droppedBytes: 70_000_000 });
  });

  it('lists a job that carries no received message with what is known of it', () => {
    expect(brokerDeadMessage(queueOf('json'), job({ order: 1 }))).toMatchObject({
      id: '9',
      body: { order: 1 },
      conversationHandle: '',
      messageTypeName: '',
    });
  });
});

describe('migration 11 moves the old dead messages into the payload a move writes', () => {
  const migration = MSSQL_MIGRATIONS.find((m) => m.version === 11)!;
  const text = migration.batches('sqlqueue').join('\n');

  it('keeps a body as a move keeps one at most: up to BROKER_MOVE_MAX_KEPT_BYTES, else only its size', () => {
    expect(MIGRATED_BODY_MAX_BYTES).toBe(BROKER_MOVE_MAX_KEPT_BYTES);
    expect(text).toContain(
      `CASE WHEN DATALENGTH(d.[MessageBody]) <= ${BROKER_MOVE_MAX_KEPT_BYTES} THEN d.[MessageBody] END AS [body]`,
    );
    expect(text).toContain(
      `CASE WHEN DATALENGTH(d.[MessageBody]) > ${BROKER_MOVE_MAX_KEPT_BYTES} THEN DATALENGTH(d.[MessageBody]) END AS [droppedBytes]`,
    );
  });

  it("gives a migrated message a broker handler's default attempts, or its own when more", () => {
    expect(MIGRATED_MAX_ATTEMPTS).toBe(BROKER_HANDLER_DEFAULTS.maxAttempts);
    expect(text).toContain('CASE WHEN d.[Attempts] < 5 THEN 5 ELSE d.[Attempts] END');
  });

  it('names the payload fields the handler side reads (a subset of BROKER_JOB_FIELDS: no text, the body in base64)', () => {
    const payload = text.slice(text.indexOf('(SELECT d.[MessageTypeName]'), text.indexOf('FOR JSON PATH'));
    const aliases = [...payload.matchAll(/ AS \[(\w+)\]/g)].map((m) => m[1]);
    const { text: _text, ...rest } = BROKER_JOB_FIELDS;
    expect(aliases).toEqual(Object.values(rest));
  });
});
