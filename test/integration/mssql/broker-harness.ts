/**
 * What the Service Broker live tests (broker-*.mssql.spec.ts) share: a schema of their own,
 * Nest applications booted there with the `broker` option (each closed after its test), handler
 * classes built from functions, a recorder of broker events, the test's own T-SQL views of the
 * conversations and queues, and the teardown of the broker objects and the schema.
 */
import { Injectable, Module, type INestApplicationContext, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import sql from 'mssql';
import { afterAll, afterEach } from 'vitest';
import { resolveBrokerOptions } from '../../../lib/src/broker/broker.options.js';
import { brokerTeardownBatches } from '../../../lib/src/broker/broker.setup.js';
import type {
  BrokerSnapshot,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from '../../../lib/src/broker/broker.types.js';
import { SqlQueueHealthIndicator, SqlQueueHealthModule } from '../../../lib/src/health.js';
import {
  QueueHandler,
  QueueProducer,
  SQL_QUEUE_RUNTIME,
  SqlQueueModule,
  type BrokerMessageContext,
  type BrokerOptions,
  type BrokerQueueOptions,
  type QueueEventListener,
  type SqlQueueModuleOptions,
  type SqlQueueRuntime,
} from '../../../lib/src/index.js';
import { quoteBrokerObject } from '../../../lib/src/broker/broker.names.js';
import {
  brokerNamePrefix,
  ENDPOINTS_BY_STATE,
  ENDPOINTS_OF_CONVERSATION,
  EVENT_NOTIFICATIONS_OF_QUEUE,
  QUEUE_STATUS,
} from '../../helpers/broker-test-queries.js';
import { CaptureLogger } from '../../helpers/capture-logger.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { dropMssqlSchema, mssqlRows, withMssqlPool } from '../../helpers/mssql.js';
import type { MssqlDatabase } from './mssql-databases.js';

export type BrokerHandlerFn = (body: unknown, context: BrokerMessageContext) => Promise<void>;

/** One `@QueueHandler(queue)` provider class calling `fn`, as a user would write one. */
export function brokerHandlerClass(queue: string, fn: BrokerHandlerFn): Type {
  class BrokerTestHandler {
    handle(body: unknown, context: BrokerMessageContext): Promise<void> {
      return fn(body, context);
    }
  }
  Object.defineProperty(BrokerTestHandler, 'name', { value: `BrokerTestHandler_${queue.replace(/\W/g, '_')}` });
  QueueHandler(queue)(BrokerTestHandler);
  Injectable()(BrokerTestHandler);
  return BrokerTestHandler;
}

type BrokerEventName = Extract<keyof QueueEventListener, `broker${string}`>;

export interface RecordedBrokerEvent {
  name: BrokerEventName;
  queue: string;
  at: number;
  [key: string]: unknown;
}

/** Every broker event an application emitted, in order. */
export class BrokerEvents {
  readonly all: RecordedBrokerEvent[] = [];

  readonly listener: QueueEventListener = {
    brokerHandled: (event) => this.push('brokerHandled', event),
    brokerFailed: (event) => this.push('brokerFailed', event),
    brokerDeadLettered: (event) => this.push('brokerDeadLettered', event),
    brokerReadersChanged: (event) => this.push('brokerReadersChanged', event),
    brokerActivated: (event) => this.push('brokerActivated', event),
    brokerNotificationLost: (event) => this.push('brokerNotificationLost', event),
  };

  private push(name: BrokerEventName, event: { queue: string }): void {
    this.all.push({ ...event, name, at: Date.now() });
  }

  of(name: BrokerEventName, queue?: string): RecordedBrokerEvent[] {
    return this.all.filter((e) => e.name === name && (queue === undefined || e.queue === queue));
  }

  /** The most readers `queue` had at once so far. */
  peakReaders(queue: string): number {
    return Math.max(0, ...this.of('brokerReadersChanged', queue).map((e) => Number(e.readers)));
  }

  /** Readers of `queue` after its last change (0 before the first). */
  readers(queue: string): number {
    const changes = this.of('brokerReadersChanged', queue);
    return Number(changes.at(-1)?.readers ?? 0);
  }
}

export interface BrokerBootOptions {
  /** Broker queues (merged over the suite's defaults). */
  queues?: Record<string, BrokerQueueOptions>;
  /** Everything else under `broker`. */
  broker?: Omit<BrokerOptions, 'queues'>;
  /** Handlers by broker queue name; a queue without one is not consumed here. */
  handlers?: Record<string, BrokerHandlerFn>;
  /** Other module options (consumer, migrations, …). */
  module?: Partial<SqlQueueModuleOptions>;
  /** Another database or login than the suite's. */
  url?: string;
  /** Keep it open after the test (the test closes it). */
  keep?: boolean;
  /** The application's logger (default: a new one), e.g. to read what a failed boot logged. */
  logger?: CaptureLogger;
}

export interface BrokerApp {
  app: INestApplicationContext;
  producer: QueueProducer;
  events: BrokerEvents;
  logger: CaptureLogger;
  /** The broker transport's view of this process (readers, busy readers). */
  snapshot(): BrokerSnapshot;
  /** SqlQueueHealthIndicator.broker(key, queue): 'up' or 'down' and the details. */
  health(queue: string): Promise<{ status: string; [key: string]: unknown }>;
  close(): Promise<void>;
}

/** Fast settings for tests: short idle waits and polls; a dialog lives the default day. */
export const TEST_BROKER: Omit<BrokerOptions, 'queues'> = {
  setup: 'auto',
  waitTimeoutMs: 1_000,
  pollIntervalMs: 1_000,
};

/**
 * A test file's schema on `db`, and the applications its tests boot there: each closed after its
 * test; the broker objects of every queue a test declared, then the schema, dropped after the file.
 */
export function brokerSuite(db: MssqlDatabase, prefix: string) {
  const schema = uniqueSchema(prefix);
  const apps: BrokerApp[] = [];
  // Every broker queue any boot declared, for the teardown.
  const declared: Record<string, BrokerQueueOptions> = {};

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close().catch(() => undefined)));
  });
  afterAll(async () => {
    if (Object.keys(declared).length > 0) {
      const options = resolved({ queues: declared });
      await withMssqlPool(db.url, async (pool) => {
        for (const batch of brokerTeardownBatches(options)) await pool.request().batch(batch);
      });
    }
    await dropMssqlSchema(db.url, schema);
  });

  function resolved(broker: BrokerOptions): ResolvedBrokerOptions {
    return resolveBrokerOptions(broker, schema)!;
  }

  /** The resolved names and settings of broker queue `name` (defaults unless `options` says otherwise). */
  function queue(name: string, options: BrokerQueueOptions = declared[name] ?? {}): ResolvedBrokerQueue {
    return resolved({ queues: { [name]: options } }).queues[0]!;
  }

  async function boot(options: BrokerBootOptions = {}): Promise<BrokerApp> {
    const queues = options.queues ?? { orders: {} };
    Object.assign(declared, queues);
    const events = new BrokerEvents();
    const logger = options.logger ?? new CaptureLogger();
    const handlers = Object.entries(options.handlers ?? {}).map(([name, fn]) => brokerHandlerClass(name, fn));
    const moduleOptions: SqlQueueModuleOptions = {
      connection: { dialect: 'mssql', url: options.url ?? db.url, poolSize: 12 },
      schema,
      ...options.module,
      broker: { ...TEST_BROKER, ...options.broker, queues },
      listeners: [events.listener, ...(options.module?.listeners ?? [])],
    };
    @Module({
      imports: [ScheduleModule.forRoot(), SqlQueueModule.forRoot(moduleOptions), SqlQueueHealthModule],
      providers: handlers,
    })
    class BrokerTestModule {}
    const app = await NestFactory.createApplicationContext(BrokerTestModule, { logger, abortOnError: false });
    let closed = false;
    const result: BrokerApp = {
      app,
      producer: app.get(QueueProducer),
      events,
      logger,
      snapshot: () => app.get<SqlQueueRuntime>(SQL_QUEUE_RUNTIME).broker!.snapshot(),
      async health(name) {
        const reading = await app.get(SqlQueueHealthIndicator).broker('broker', name);
        return reading.broker as { status: string };
      },
      async close() {
        if (closed) return;
        closed = true;
        await app.close();
      },
    };
    if (!options.keep) apps.push(result);
    return result;
  }

  /**
   * Conversation endpoints of the services of broker queue `name` (default: of every broker
   * queue of this schema), by state and side.
   */
  async function endpointsByState(name?: string): Promise<{ State: string; Initiator: number; Endpoints: number }[]> {
    return mssqlRows(db.url, ENDPOINTS_BY_STATE, (r) =>
      r.input('prefix', sql.NVarChar(256), brokerNamePrefix(schema, name)),
    );
  }

  /** Both endpoints of the conversation `handle` (either side) belongs to. */
  async function endpointsOf(
    handle: string,
  ): Promise<{ Initiator: number; State: string; Handle: string; GroupId: string }[]> {
    return mssqlRows(db.url, ENDPOINTS_OF_CONVERSATION, (r) => r.input('handle', sql.UniqueIdentifier, handle));
  }

  /** is_receive_enabled of a broker queue's target queue (null: no such queue). */
  async function receiveEnabled(name: string): Promise<number | null> {
    const [row] = await mssqlRows<{ ReceiveEnabled: number }>(db.url, QUEUE_STATUS, (r) =>
      r.input('queue', sql.NVarChar(300), quoteBrokerObject(queue(name).queue)),
    );
    return row?.ReceiveEnabled ?? null;
  }

  async function eventNotifications(name: string): Promise<string[]> {
    const rows = await mssqlRows<{ Name: string }>(db.url, EVENT_NOTIFICATIONS_OF_QUEUE, (r) =>
      r.input('queue', sql.NVarChar(300), quoteBrokerObject(queue(name).queue)),
    );
    return rows.map((row) => row.Name);
  }

  return { schema, boot, queue, resolved, endpointsByState, endpointsOf, receiveEnabled, eventNotifications };
}

/** Endpoints left in a state that only ends when an application acts (no CLOSED, no live dialog). */
export function strandedEndpoints(rows: readonly { State: string; Endpoints: number }[]): Record<string, number> {
  const stranded: Record<string, number> = {};
  for (const row of rows) {
    if (row.State === 'CLOSED' || row.State === 'CONVERSING') continue;
    stranded[row.State] = (stranded[row.State] ?? 0) + row.Endpoints;
  }
  return stranded;
}

/** A handler that records every call, the calls running at once, and overlaps per conversation. */
export class CallLog<B = unknown> {
  readonly calls: { body: B; context: BrokerMessageContext; startedAt: number; endedAt: number }[] = [];
  readonly overlaps: string[] = [];
  running = 0;
  peak = 0;
  private readonly busy = new Map<string, number>();

  /** `work` runs inside the bookkeeping (a throw still counts as an ended call). */
  handler(work: (body: B, context: BrokerMessageContext) => Promise<void> = () => yieldOnce()): BrokerHandlerFn {
    return async (body, context) => {
      const key = context.conversationHandle;
      const busy = this.busy.get(key) ?? 0;
      if (busy > 0) this.overlaps.push(`${key} #${context.messageSequenceNumber}`);
      this.busy.set(key, busy + 1);
      this.running++;
      this.peak = Math.max(this.peak, this.running);
      const startedAt = Date.now();
      try {
        await work(body as B, context);
        this.calls.push({ body: body as B, context, startedAt, endedAt: Date.now() });
      } finally {
        this.running--;
        this.busy.set(key, (this.busy.get(key) ?? 1) - 1);
      }
    };
  }

  bodies(): B[] {
    return this.calls.map((call) => call.body);
  }

  /** The `n` of every handled body, ascending (for bodies `{ n }`). */
  handledNs(): number[] {
    return this.calls.map((call) => (call.body as { n: number }).n).sort((a, b) => a - b);
  }
}

/** Lets other handlers run between a call's start and end, so an overlap would show. */
export function yieldOnce(ms = 1): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Sequence numbers (bigint) of each conversation's handled messages, in handling order. */
export function sequencesByConversation(calls: readonly { context: BrokerMessageContext }[]): Map<string, bigint[]> {
  const byConversation = new Map<string, bigint[]>();
  for (const { context } of calls) {
    const list = byConversation.get(context.conversationHandle) ?? [];
    list.push(BigInt(context.messageSequenceNumber));
    byConversation.set(context.conversationHandle, list);
  }
  return byConversation;
}

/** Conversations whose handled sequence numbers are not strictly increasing. */
export function outOfOrder(byConversation: Map<string, bigint[]>): string[] {
  const wrong: string[] = [];
  for (const [conversation, sequences] of byConversation) {
    if (sequences.some((n, i) => i > 0 && n <= sequences[i - 1]!)) wrong.push(conversation);
  }
  return wrong;
}
