/**
 * A broker queue's whole consuming side without Nest and without SQL Server: the real
 * BrokerConsumer (receivers and their activation pool) on a PgBrokerDouble, and the real
 * table-queue consumer running the real broker job handler, as SqlQueueConsumerHost wires them
 * on SQL Server. Used in-process by the broker specs on PostgreSQL and in the broker crash
 * drill's worker processes.
 */
import { BrokerConsumer } from '../../lib/src/broker/activation/broker.consumer.js';
import { brokerJobHandler } from '../../lib/src/broker/reader/broker.job.js';
import type { BrokerHandler, ResolvedBrokerQueue } from '../../lib/src/broker/broker.types.js';
import { systemClock } from '../../lib/src/core/clock.js';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import { silentLogger, type QueueLogger } from '../../lib/src/core/logger.js';
import { resolveConsumerOptions, resolveQueueOptions, type QueueOptions } from '../../lib/src/core/options.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import type { PgBrokerDouble } from './pg-broker-double.js';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../../lib/src/core/validation.js';

export interface BrokerEngineOptions {
  store: QueueStore;
  double: PgBrokerDouble;
  /** The broker queue, resolved from the broker option (its handlerOptions are the module layer). */
  queue: ResolvedBrokerQueue;
  handler: BrokerHandler;
  /** Handler-level options (@QueueHandler's), over the queue's. */
  handlerOptions?: QueueOptions;
  waitTimeoutMs?: number;
  listeners?: QueueEventListener[];
  logger?: QueueLogger;
  workerId?: string;
}

export interface BrokerEngine {
  readonly consumer: SqlQueueConsumer;
  readonly broker: BrokerConsumer;
  stop(timeoutMs?: number): Promise<void>;
}

/** Records the queue's settings (as a consuming process does at boot), then starts both sides. */
export async function startBrokerEngine(options: BrokerEngineOptions): Promise<BrokerEngine> {
  const { store, double, queue } = options;
  const logger = options.logger ?? silentLogger;
  const listeners = options.listeners ?? [];
  const resolved = resolveQueueOptions(
    queue.name,
    { module: queue.handlerOptions, handler: options.handlerOptions },
    resolveConsumerOptions({ minPollMs: 20, maxPollMs: 200 }),
  );
  await store.recordQueueSettings([
    { queue: queue.name, maxAttempts: resolved.maxAttempts, groupOnDead: resolved.groupOnDead },
  ]);
  const wakeBus = new WakeBus();
  const consumer = new SqlQueueConsumer({
    store,
    clock: systemClock,
    logger,
    listeners,
    wakeBus,
    workerId: options.workerId ?? `broker-engine:${process.pid}`,
    listenForWakeups: false,
  });
  consumer.register(
    resolved,
    brokerJobHandler({
      maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      queue,
      handler: options.handler,
      endConversation: (handle) => double.endConversation(handle),
    }),
  );
  const broker = new BrokerConsumer({
    maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
    driver: double,
    options: {
      schema: store.schema,
      setup: 'off',
      enableBroker: false,
      waitTimeoutMs: options.waitTimeoutMs ?? 500,
      requestTimeoutMs: 60_000,
      pollIntervalMs: 60_000,
      unkeyedDialogs: 1,
      dialogRecycleMs: null,
      notificationQueue: { schema: store.schema, name: 'unused' },
      notificationService: 'unused',
      queues: [queue],
      doorbell: null,
    },
    clock: systemClock,
    logger,
    listeners,
    onMoved: (name) => wakeBus.wake(name),
    // QUEUE_ACTIVATION is Service Broker's; the receivers' own pool (min..max) is what runs here.
    createListener: () => ({
      start: () => undefined,
      stop: async () => undefined,
      snapshot: () => ({ running: true, lastLoopAt: Date.now(), failing: false, queues: new Map() }),
    }),
  });
  broker.register(queue, resolved.maxAttempts);
  await consumer.start();
  broker.start();
  return {
    consumer,
    broker,
    async stop(timeoutMs = 5_000) {
      await Promise.all([broker.stop(timeoutMs), consumer.stop(timeoutMs)]);
    },
  };
}
