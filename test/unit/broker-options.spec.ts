import { describe, expect, it } from 'vitest';
import { BROKER_DEFAULT_BACKOFF, resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import type { BrokerOptions, BrokerQueueOptions } from '../../lib/src/broker/broker.types.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { CUSTOM_BROKER_NAMES } from '../helpers/broker-observation.js';

const resolve = (raw: unknown, tableQueues: string[] = []) =>
  resolveBrokerOptions(raw as BrokerOptions, 'app', tableQueues);
const oneQueue = (options: unknown, extra: Record<string, unknown> = {}) =>
  resolve({ queues: { orders: options as BrokerQueueOptions }, ...extra });
const expectError = (raw: unknown, message: string | RegExp, tableQueues: string[] = []) => {
  expect(() => resolve(raw, tableQueues)).toThrow(SqlQueueConfigError);
  expect(() => resolve(raw, tableQueues)).toThrow(message);
};

describe('resolveBrokerOptions: defaults', () => {
  it('is null without the broker option', () => {
    expect(resolveBrokerOptions(undefined, 'app', [])).toBeNull();
  });

  it('fills in every module-level default', () => {
    const r = resolve({ queues: { orders: {} } })!;
    expect(r).toMatchObject({
      schema: 'app',
      setup: 'auto',
      enableBroker: false,
      waitTimeoutMs: 5_000,
      requestTimeoutMs: 20_000,
      pollIntervalMs: 10_000,
      unkeyedDialogs: 8,
      dialogRecycleMs: 86_400_000,
      notificationQueue: { schema: 'app', name: 'BrokerActivationQueue' },
      notificationService: 'nestjs-sql-queue/app/activation',
    });
    expect(resolve({ queues: { orders: {} }, waitTimeoutMs: 30_000 })!.requestTimeoutMs).toBe(45_000);
    expect(resolve({ queues: { orders: {} }, dialogRecycleMs: null })!.dialogRecycleMs).toBeNull();
  });

  it('fills in every queue default, names derived from the schema and the queue name', () => {
    const [q] = resolve({ queues: { orders: {} } })!.queues;
    expect(q).toMatchObject({
      name: 'orders',
      queue: { schema: 'app', name: 'orders_TargetQueue' },
      initiatorQueue: { schema: 'app', name: 'orders_InitiatorQueue' },
      service: 'nestjs-sql-queue/app/orders/target',
      initiatorService: 'nestjs-sql-queue/app/orders/initiator',
      contract: 'nestjs-sql-queue/app/orders/contract',
      messageType: 'nestjs-sql-queue/app/orders/message',
      closeMessageType: 'nestjs-sql-queue/app/orders/close',
      activationNotification: 'sqlqueue_activation',
      disabledNotification: 'sqlqueue_disabled',
      format: 'json',
      minReceivers: 1,
      maxReceivers: 2,
      messagesPerTransaction: 100,
      handlerOptions: { maxAttempts: 5, backoff: BROKER_DEFAULT_BACKOFF, groupBatchSize: 10 },
    });
    expect(oneQueue({ minReceivers: 3 })!.queues[0]!.maxReceivers).toBe(3);
    expect(() => oneQueue({ minReceivers: 3, maxReceivers: 2 })).toThrow(
      "broker.queues['orders']: minReceivers (3) is greater than maxReceivers (2)",
    );
    expect(() => oneQueue({ messagesPerTransaction: 1_001 })).toThrow(
      /messagesPerTransaction must be an integer from 1 to 1000/,
    );
  });

  it('takes the table-queue options of its handlers, validated, over the broker defaults', () => {
    const q = oneQueue({ maxReaders: 20, maxAttempts: 9, leaseMs: 5_000, groupOnDead: 'block', maxDurationMs: null })!
      .queues[0]!;
    expect(q.handlerOptions).toEqual({
      maxAttempts: 9,
      backoff: BROKER_DEFAULT_BACKOFF,
      groupBatchSize: 10,
      maxReaders: 20,
      leaseMs: 5_000,
      groupOnDead: 'block',
      maxDurationMs: null,
    });
    expect(() => oneQueue({ leaseMs: 1 })).toThrow(/broker.queues\['orders'\].leaseMs must be an integer/);
    expect(() => oneQueue({ groupOnDead: 'skip' as never })).toThrow(/groupOnDead must be 'continue' or 'block'/);
    expect(() => oneQueue({ receivers: 2 } as never)).toThrow(/receivers/);
  });

  it('backs off exponentially from 1 s, doubling, up to 1 min, with equal jitter', () => {
    expect(BROKER_DEFAULT_BACKOFF).toEqual({
      type: 'exponential',
      baseMs: 1_000,
      factor: 2,
      maxMs: 60_000,
      jitter: 'equal',
    });
  });

  it('takes explicit names, queues in another schema and every format', () => {
    const r = oneQueue({
      ...CUSTOM_BROKER_NAMES,
      format: 'xml',
    })!;
    expect(r.queues[0]).toMatchObject({
      queue: { schema: 'ops', name: 'Work' },
      initiatorQueue: { schema: 'app', name: 'WorkReplies' },
      service: '//example.com/work',
      initiatorService: '//example.com/work/client',
      contract: 'urn:work:contract',
      messageType: 'urn:work:message',
      closeMessageType: 'urn:work:close',
      format: 'xml',
    });
    expect(oneQueue({ format: 'raw' })!.queues[0]!.format).toBe('raw');
  });

  it('lets broker queues share message types and a contract defined the same way', () => {
    const shared = { contract: 'c', messageType: 'm', closeMessageType: 'close' };
    const r = resolve({ queues: { a: shared, b: shared } })!;
    expect(r.queues.map((q) => q.contract)).toEqual(['c', 'c']);
  });
});

describe('resolveBrokerOptions: errors', () => {
  it('names an unknown option and the one it probably meant', () => {
    expectError(
      { queues: { orders: {} }, waitTimeout: 1 },
      "broker: unknown option 'waitTimeout' (did you mean 'waitTimeoutMs'?)",
    );
    expectError(
      { queues: { orders: { maxReader: 2 } } },
      "broker.queues['orders']: unknown option 'maxReader' (did you mean 'maxReaders'?)",
    );
    expectError({ queues: { orders: { qeue: 'x' } } }, /unknown option 'qeue' \(did you mean 'queue'\?\)/);
  });

  it('wants objects and at least one queue', () => {
    expectError('yes', "broker must be an object, got 'yes'");
    expectError({}, 'broker.queues is required: declare each broker queue by name');
    expectError(
      { queues: {} },
      'broker.queues is empty: declare at least one broker queue (or set broker.doorbell), or leave the broker option out',
    );
    expectError({ queues: [] }, 'broker.queues must be an object, got an array');
    expectError({ queues: { orders: 5 } }, "broker.queues['orders'] must be an object, got 5");
  });

  it('takes a doorbell alone, with names of its own that no broker queue can take', () => {
    const options = resolveBrokerOptions({ doorbell: true }, 'app', [])!;
    expect(options.queues).toEqual([]);
    expect(options.doorbell).toMatchObject({
      name: '~doorbell',
      queue: { schema: 'app', name: 'DoorbellQueue' },
      initiatorQueue: { schema: 'app', name: 'DoorbellInitiatorQueue' },
      service: 'nestjs-sql-queue/app/doorbell',
      initiatorService: 'nestjs-sql-queue/app/doorbell/initiator',
      contract: 'nestjs-sql-queue/app/doorbell/contract',
      messageType: 'nestjs-sql-queue/app/doorbell/ring',
      closeMessageType: 'nestjs-sql-queue/app/doorbell/close',
      format: 'raw',
      doorbell: true,
    });
    expect(resolveBrokerOptions({ queues: { orders: {} } }, 'app', [])!.doorbell).toBeNull();
    expectError({ doorbell: 'yes', queues: { orders: {} } }, /broker.doorbell must be true or false/);
    expectError(
      { doorbell: true, queues: { orders: { queue: 'DoorbellQueue' } } },
      /broker.doorbell.queue and broker.queues\['orders'\].queue both use the queue app.DoorbellQueue/,
    );
  });

  it('checks queue names and refuses one that is also a table queue', () => {
    expectError({ queues: { 'a b': {} } }, /queue name 'a b' is invalid/);
    expectError(
      { queues: { emails: {} } },
      "broker.queues['emails']: 'emails' is also a table queue; a name is either a table queue or a broker queue",
      ['emails', 'other'],
    );
  });

  it('checks each module option with its range', () => {
    expectError(
      { queues: { orders: {} }, setup: 'always' },
      "broker.setup must be 'auto', 'print' or 'off', got 'always'",
    );
    expectError(
      { queues: { orders: {} }, enableBroker: 'yes' },
      "broker.enableBroker must be true or false, got 'yes'",
    );
    expectError(
      { queues: { orders: {} }, waitTimeoutMs: 0 },
      'broker.waitTimeoutMs must be an integer from 1 to 600000, got 0',
    );
    expectError(
      { queues: { orders: {} }, waitTimeoutMs: 600_001 },
      /broker\.waitTimeoutMs must be an integer from 1 to 600000/,
    );
    expectError({ queues: { orders: {} }, requestTimeoutMs: 1.5 }, /broker\.requestTimeoutMs must be an integer/);
    expectError(
      { queues: { orders: {} }, pollIntervalMs: 10 },
      /broker\.pollIntervalMs must be an integer from 100 to 86400000/,
    );
    expectError(
      { queues: { orders: {} }, unkeyedDialogs: 0 },
      'broker.unkeyedDialogs must be an integer from 1 to 1000, got 0',
    );
    expectError(
      { queues: { orders: {} }, unkeyedDialogs: 1001 },
      /broker\.unkeyedDialogs must be an integer from 1 to 1000/,
    );
    expectError({ queues: { orders: {} }, dialogRecycleMs: 0 }, /broker\.dialogRecycleMs must be an integer from 1000/);
  });

  it('wants requestTimeoutMs above waitTimeoutMs + 5 s, naming both options', () => {
    const message =
      'broker.requestTimeoutMs (10000) must exceed broker.waitTimeoutMs (5000) by more than 5000 ms, or the driver cancels every idle WAITFOR: raise broker.requestTimeoutMs above 10000 or lower broker.waitTimeoutMs';
    expectError({ queues: { orders: {} }, requestTimeoutMs: 10_000 }, message);
    expectError({ queues: { orders: {} }, requestTimeoutMs: 4_000 }, /must exceed broker\.waitTimeoutMs \(5000\)/);
    expect(resolve({ queues: { orders: {} }, requestTimeoutMs: 10_001 })!.requestTimeoutMs).toBe(10_001);
  });

  it('checks each queue option with its range', () => {
    const q = (options: unknown, message: string | RegExp) => expectError({ queues: { orders: options } }, message);
    const at = "broker.queues['orders']";
    q({ format: 'yaml' }, `${at}.format must be 'json', 'raw' or 'xml', got 'yaml'`);
    q({ minReaders: 0 }, `${at}.minReaders must be an integer from 1 to 1000, got 0`);
    q({ maxReaders: 0 }, `${at}.maxReaders must be an integer from 1 to 1000, got 0`);
    q({ maxReaders: 1001 }, `${at}.maxReaders must be an integer from 1 to 1000, got 1001`);
    q({ minReaders: 3, maxReaders: 2 }, `${at}: minReaders (3) is greater than maxReaders (2)`);
    q({ maxAttempts: 0 }, `${at}.maxAttempts must be an integer from 1 to 10000, got 0`);
    q({ maxAttempts: 10_001 }, `${at}.maxAttempts must be an integer from 1 to 10000, got 10001`);
    q({ messagesPerTransaction: 0 }, `${at}.messagesPerTransaction must be an integer from 1 to 1000, got 0`);
    q({ messagesPerTransaction: 1_001 }, `${at}.messagesPerTransaction must be an integer from 1 to 1000, got 1001`);
    q({ minReceivers: 0 }, `${at}.minReceivers must be an integer from 1 to 100, got 0`);
    q({ maxReceivers: 101 }, `${at}.maxReceivers must be an integer from 1 to 100, got 101`);
    q({ maxDurationMs: 0 }, `${at}.maxDurationMs must be an integer from 1 to 2147483647, got 0`);
    q(
      { backoff: { type: 'fixed', delayMs: -1 } },
      `${at}.backoff.delayMs must be an integer from 0 to 2147483647, got -1`,
    );
    q({ backoff: 'soon' }, /broker\.queues\['orders'\]\.backoff must be \{ type: 'exponential', … \}/);
  });

  it('checks every explicit name, and says which option to set when a default is too long', () => {
    const at = "broker.queues['orders']";
    expectError(
      { queues: { orders: { queue: 'a.b.c' } } },
      new RegExp(`^${at.replace(/[[\]']/g, '\\$&')}\\.queue 'a\\.b\\.c' is invalid`),
    );
    expectError({ queues: { orders: { initiatorQueue: 'x y' } } }, /\.initiatorQueue 'x y' is invalid/);
    for (const key of ['service', 'initiatorService', 'contract', 'messageType', 'closeMessageType']) {
      expectError({ queues: { orders: { [key]: "it's" } } }, `${at}.${key} 'it's' is invalid`);
    }
    expectError({ queues: { orders: { contract: 'ANY' } } }, /\.contract 'ANY' is reserved by Service Broker/);
    const long = 'q'.repeat(120);
    expectError(
      { queues: { [long]: {} } },
      new RegExp(
        `broker\\.queues\\['${long}'\\]\\.queue: the default '${long}_TargetQueue' is longer than 128 characters`,
      ),
    );
    expectError(
      { queues: { [long]: { queue: 'q', initiatorQueue: 'qi' } } },
      /\.service: the default 'nestjs-sql-queue\/app\/q+…' is longer than 128 characters: set broker\.queues\['q+'\]\.service explicitly/,
    );
    expectError(
      { queues: { orders: { messageType: 'm', closeMessageType: 'm' } } },
      `${at}: messageType and closeMessageType are both 'm'`,
    );
  });

  it('refuses two broker queues on one SQL queue or one service', () => {
    expectError(
      { queues: { a: { queue: 'shared' }, b: { queue: 'app.Shared' } } },
      "broker.queues['b'].queue and broker.queues['a'].queue both use the queue app.Shared: give each its own queue",
    );
    expectError(
      { queues: { a: { queue: 'BrokerActivationQueue' } } },
      "broker.queues['a'].queue and the notification queue both use the queue app.BrokerActivationQueue",
    );
    expectError(
      { queues: { a: { queue: 'q', initiatorQueue: 'q' } } },
      /initiatorQueue and broker\.queues\['a'\]\.queue both use/,
    );
    expectError(
      { queues: { a: { service: 's' }, b: { service: 's' } } },
      "broker.queues['b'].service and broker.queues['a'].service both use the service 's': give each its own service",
    );
    expectError({ queues: { a: { initiatorService: 'nestjs-sql-queue/app/activation' } } }, /the notification service/);
  });

  it('refuses shared message types or contracts defined two ways', () => {
    expectError(
      { queues: { a: { messageType: 'm' }, b: { messageType: 'm', format: 'xml' } } },
      "broker.queues['b'].messageType 'm' is also broker.queues['a'].messageType, with another validation (NONE, here WELL_FORMED_XML",
    );
    expectError(
      { queues: { a: { contract: 'c' }, b: { contract: 'c' } } },
      "broker.queues['b'].contract 'c' is also broker.queues['a'].contract, with other message types",
    );
  });
});
