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
import { brokerTeardownBatches } from '../../../lib/src/broker/setup/broker.setup.js';
import type {
  BrokerObjectName,
  BrokerSnapshot,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from '../../../lib/src/broker/broker.types.js';
import { SqlQueueHealthIndicator, SqlQueueHealthModule } from '../../../lib/src/health.js';
import {
  QueueHandler,
  QueueProducer,
  SQL_QUEUE_RUNTIME,
  SqlQueueConsumerHost,
  SqlQueueModule,
  type BrokerMessageContext,
  type ConsumerSnapshot,
  type BrokerOptions,
  type BrokerQueueOptions,
  type QueueEventListener,
  type SqlQueueModuleOptions,
  type SqlQueueRuntime,
} from '../../../lib/src/index.js';
import { quoteBrokerObject } from '../../../lib/src/broker/broker.names.js';
import {
  brokerJobsByMessage,
  brokerNamePrefix,
  ENDPOINTS_BY_STATE,
  ENDPOINTS_OF_CONVERSATION,
  EVENT_NOTIFICATIONS_OF_QUEUE,
  jobStatesOfQueue,
  LOCKS_ON_QUEUE,
  messagesInQueue,
  QUEUE_STATUS,
  receiveAny,
} from '../../helpers/broker-test-queries.js';
import { VIEW_SERVER_STATE } from '../../helpers/mssql-test-queries.js';
import { CaptureLogger } from '../../helpers/capture-logger.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { beginCallerTransaction, dropMssqlSchema, mssqlRows, withMssqlPool } from '../../helpers/mssql.js';
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

/** Broker events, and the table-queue events of the broker queues' jobs. */
type BrokerEventName = Extract<keyof QueueEventListener, `broker${string}`> | 'completed' | 'failed';

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
    completed: (event) => this.push('completed', event),
    failed: (event) => this.push('failed', event),
    brokerMoved: (event) => this.push('brokerMoved', event),
    brokerReceiversChanged: (event) => this.push('brokerReceiversChanged', event),
    brokerActivated: (event) => this.push('brokerActivated', event),
    brokerNotificationLost: (event) => this.push('brokerNotificationLost', event),
  };

  private push(name: BrokerEventName, event: { queue: string }): void {
    this.all.push({ ...event, name, at: Date.now() });
  }

  of(name: BrokerEventName, queue?: string): RecordedBrokerEvent[] {
    return this.all.filter((e) => e.name === name && (queue === undefined || e.queue === queue));
  }

  /** The most receivers `queue` had at once so far. */
  peakReceivers(queue: string): number {
    return Math.max(0, ...this.of('brokerReceiversChanged', queue).map((e) => Number(e.receivers)));
  }

  /** Receivers of `queue` after its last change (0 before the first). */
  receivers(queue: string): number {
    const changes = this.of('brokerReceiversChanged', queue);
    return Number(changes.at(-1)?.receivers ?? 0);
  }

  /** Messages of `queue` that receivers of this application moved into its table queue so far. */
  moved(queue: string): number {
    return this.of('brokerMoved', queue).reduce((sum, e) => sum + Number(e.moved), 0);
  }
}

/** sys.service_queues as QUEUE_STATUS reads it. */
export interface QueueStatusRow {
  ReceiveEnabled: number;
  EnqueueEnabled: number;
  /** is_poison_message_handling_enabled. */
  PoisonHandling: number;
}

/** A lock request on a queue or its internal table (LOCKS_ON_QUEUE). */
export interface QueueLockRow {
  Session: number;
  Mode: string;
  Status: string;
  On: 'queue' | 'internal table';
}

/** One received message's jobs (brokerJobsByMessage). */
export interface BrokerJobRow {
  ConversationHandle: string;
  Sequence: string;
  Type: string;
  Text: string | null;
  Jobs: number | string;
  Done: number | string;
  Attempts: number;
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
  /** The broker transport's view of this process (receivers, busy receivers). */
  snapshot(): BrokerSnapshot;
  /** The table-queue consumer's view (handler readers, handlers running), broker queues' handlers included. */
  consumer(): ConsumerSnapshot;
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
  // Every broker queue any boot declared, and whether one set up the doorbell, for the teardown.
  const declared: Record<string, BrokerQueueOptions> = {};
  let doorbell = false;

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close().catch(() => undefined)));
  });
  afterAll(async () => {
    if (Object.keys(declared).length > 0 || doorbell) {
      const options = resolved({ queues: declared, doorbell });
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
    if (options.broker?.doorbell) doorbell = true;
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
      consumer: () => app.get(SqlQueueConsumerHost).snapshot(),
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

  /** What sys.service_queues says of a Service Broker queue (null: no such queue). */
  async function queueStatus(object: BrokerObjectName): Promise<QueueStatusRow | null> {
    const [row] = await mssqlRows<QueueStatusRow>(db.url, QUEUE_STATUS, (r) =>
      r.input('queue', sql.NVarChar(300), quoteBrokerObject(object)),
    );
    return row ?? null;
  }

  /** is_receive_enabled of a broker queue's target queue (null: no such queue). */
  async function receiveEnabled(name: string): Promise<number | null> {
    return (await queueStatus(queue(name).queue))?.ReceiveEnabled ?? null;
  }

  /** Messages in a Service Broker queue, received or not (a SELECT on a queue never receives). */
  async function messagesIn(object: BrokerObjectName): Promise<number> {
    const [row] = await mssqlRows<{ Messages: number }>(db.url, messagesInQueue(object));
    return Number(row?.Messages ?? 0);
  }

  /** Whether the suite's login may read sys.dm_tran_locks and other sessions' requests. */
  async function canViewServerState(): Promise<boolean> {
    const [row] = await mssqlRows<{ Granted: number | null }>(db.url, VIEW_SERVER_STATE);
    return row?.Granted === 1;
  }

  /** Lock requests of other sessions on a Service Broker queue and its internal table (needs VIEW SERVER STATE). */
  async function locksOn(object: BrokerObjectName): Promise<QueueLockRow[]> {
    return mssqlRows<QueueLockRow>(db.url, LOCKS_ON_QUEUE, (r) =>
      r.input('queue', sql.NVarChar(300), quoteBrokerObject(object)),
    );
  }

  /**
   * `times` transactions on a session of their own, each receiving one message of `object` and
   * rolling back, as an operator "inspecting" a message or a crashed reader would: the message
   * returns to the queue each time. Fails unless each RECEIVE got a message.
   */
  async function receiveAndRollBack(object: BrokerObjectName, times: number): Promise<void> {
    for (let i = 1; i <= times; i++) {
      const session = await beginCallerTransaction(db.url);
      try {
        const got = await new sql.Request(session.transaction).query<{ Handle: string }>(receiveAny(object));
        if (got.recordset.length !== 1) {
          throw new Error(`rolled-back receive ${i} of ${times} on ${quoteBrokerObject(object)} got no message`);
        }
      } finally {
        await session.close(); // rolls back: the message returns to the queue
      }
    }
  }

  /** The jobs of broker queue `name`'s table queue, one row per message they carry. */
  async function jobsByMessage(name: string): Promise<BrokerJobRow[]> {
    return mssqlRows<BrokerJobRow>(db.url, brokerJobsByMessage(schema), (r) =>
      r.input('queue', sql.NVarChar(128), name),
    );
  }

  /** Jobs of table queue `name` by state (read without waiting on leases). */
  async function jobStates(name: string): Promise<Record<string, number>> {
    const rows = await mssqlRows<{ State: string; Jobs: number | string }>(db.url, jobStatesOfQueue(schema), (r) =>
      r.input('queue', sql.NVarChar(128), name),
    );
    return Object.fromEntries(rows.map((row) => [row.State, Number(row.Jobs)]));
  }

  async function eventNotifications(name: string): Promise<string[]> {
    const rows = await mssqlRows<{ Name: string }>(db.url, EVENT_NOTIFICATIONS_OF_QUEUE, (r) =>
      r.input('queue', sql.NVarChar(300), quoteBrokerObject(queue(name).queue)),
    );
    return rows.map((row) => row.Name);
  }

  return {
    schema,
    boot,
    queue,
    resolved,
    endpointsByState,
    endpointsOf,
    queueStatus,
    receiveEnabled,
    messagesIn,
    canViewServerState,
    locksOn,
    receiveAndRollBack,
    jobsByMessage,
    jobStates,
    eventNotifications,
  };
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
