import { systemClock, type Clock } from '../core/clock.js';
import { SqlQueueConfigError } from '../core/errors.js';
import type { QueueEventListener } from '../core/events.js';
import type { QueueLogger } from '../core/logger.js';
import { settleWithin } from '../core/timeout.js';
import type { MssqlQueueStore } from '../store/mssql/mssql.store.js';
import { BrokerAdmin } from './broker.admin.js';
import { BrokerConsumer } from './broker.consumer.js';
import { BrokerDoorbell } from './broker.doorbell.js';
import { brokerSetupQueues } from './broker.options.js';
import { readBrokerHealth } from './broker.health.js';
import { createMssqlBrokerDriver } from './broker.mssql-driver.js';
import { sweepOrphanedAttempts } from './broker.reader.queries.js';
import { BrokerSender } from './broker.sender.js';
import {
  applyBrokerSetup,
  assessBrokerSetup,
  brokerBootDecision,
  brokerObservationQuery,
  parseBrokerObservation,
} from './broker.setup.js';
import type {
  BrokerDeadMessagePage,
  BrokerDriver,
  BrokerHandler,
  BrokerHealthReading,
  BrokerQueueStats,
  BrokerRuntimeApi,
  BrokerSent,
  BrokerSnapshot,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from './broker.types.js';

/**
 * How long close() waits for the reader pool. Closing a pool waits for every connection checked
 * out, and a reader whose handler ignores its abort signal keeps its connection for as long as
 * the handler runs: that must not hold the application's shutdown.
 */
export const BROKER_CLOSE_TIMEOUT_MS = 5_000;

export interface BrokerRuntimeDeps {
  store: MssqlQueueStore;
  options: ResolvedBrokerOptions;
  logger: QueueLogger;
  workerId: string;
  listeners: readonly QueueEventListener[];
  maxPayloadBytes: number;
  /** False in a producer-only process: no readers of target queues, no activation listener. */
  consume: boolean;
  clock?: Clock;
}

/**
 * Connects the Service Broker transport: a reader pool, then the boot check of the broker
 * objects (setting them up when `setup` is 'auto'), then the parts that run.
 */
export async function createBrokerRuntime(deps: BrokerRuntimeDeps): Promise<BrokerRuntime> {
  const { options } = deps;
  // Readers pin a connection each for their whole life; one per reader that may run, the
  // listener's, and one per initiator queue.
  const readerConnections =
    (deps.consume ? options.queues.reduce((sum, q) => sum + q.maxReaders, 0) + listenerConnections(options) : 0) +
    initiatorQueueCount(options);
  const driver = await createMssqlBrokerDriver(deps.store, {
    readerConnections,
    requestTimeoutMs: options.requestTimeoutMs,
    onBackgroundError: (error) => deps.logger.warn(`idle Service Broker reader connection failed: ${error.message}`),
  });
  try {
    await checkBrokerSetup(driver, options, deps.logger);
  } catch (error) {
    await driver.close().catch(() => undefined);
    throw error;
  }
  return new BrokerRuntime(driver, deps, readerConnections);
}

/** How often a consuming process sweeps the attempt journal of ended conversations. */
const ATTEMPT_SWEEP_INTERVAL_MS = 3_600_000;

/** Initiator queues of the options (the doorbell's too): each gets one reader (queues may share one). */
function initiatorQueueCount(options: ResolvedBrokerOptions): number {
  return new Set(brokerSetupQueues(options).map((q) => `${q.initiatorQueue.schema}.${q.initiatorQueue.name}`)).size;
}

/** The activation listener's connection, and the doorbell listener's. */
function listenerConnections(options: ResolvedBrokerOptions): number {
  return 1 + (options.doorbell ? 1 : 0);
}

/** Observes the broker objects and does what `setup` says: nothing, create them, or fail naming the fix. */
export async function checkBrokerSetup(
  driver: BrokerDriver,
  options: ResolvedBrokerOptions,
  logger: QueueLogger,
): Promise<void> {
  const observe = async () => {
    const query = brokerObservationQuery(options);
    return assessBrokerSetup(parseBrokerObservation(await driver.query(query.text, query.params)), options);
  };
  let decision = brokerBootDecision(await observe(), options);
  if (decision.action === 'setup') {
    for (const warning of decision.warnings) logger.warn(warning);
    await applyBrokerSetup(driver, options, decision);
    logger.log(
      `Service Broker objects of ${options.queues.length} broker queue(s)${options.doorbell ? ' and the doorbell' : ''} set up (broker.setup: 'auto')`,
    );
    decision = brokerBootDecision(await observe(), options, true);
  }
  for (const warning of decision.warnings) logger.warn(warning);
  if (decision.action === 'fail') {
    if (decision.script) logger.error(`Service Broker setup script (broker.setup: 'print'):\n${decision.script}`);
    throw new SqlQueueConfigError(decision.message);
  }
}

export class BrokerRuntime implements BrokerRuntimeApi {
  readonly options: ResolvedBrokerOptions;
  private readonly byName: Map<string, ResolvedBrokerQueue>;
  private readonly sender: BrokerSender;
  private readonly admin: BrokerAdmin;
  private readonly consumer: BrokerConsumer;
  private readonly clock: Clock;
  private readonly logger: QueueLogger;
  private closed = false;

  readonly doorbell: BrokerDoorbell | null;
  private readonly consume: boolean;
  private sweepTimer: { cancel(): void } | null = null;
  private sweeping = false;
  /** The broker queues this process consumes (registered handlers). */
  private readonly consumed: ResolvedBrokerQueue[] = [];
  /** Readers registered so far (their maxReaders), against the reader pool's size. */
  private registeredReaders = 0;

  constructor(
    private readonly driver: BrokerDriver,
    deps: BrokerRuntimeDeps,
    /** Connections the reader pool was sized with; null: not limited (tests). */
    private readonly readerConnections: number | null = null,
  ) {
    this.options = deps.options;
    this.consume = deps.consume;
    this.clock = deps.clock ?? systemClock;
    this.logger = deps.logger;
    this.byName = new Map(deps.options.queues.map((queue) => [queue.name, queue]));
    this.sender = new BrokerSender({
      driver,
      schema: deps.options.schema,
      maxPayloadBytes: deps.maxPayloadBytes,
      unkeyedDialogs: deps.options.unkeyedDialogs,
      dialogRecycleMs: deps.options.dialogRecycleMs,
      logger: deps.logger,
    });
    this.admin = new BrokerAdmin({ driver, schema: deps.options.schema, sender: this.sender });
    this.consumer = new BrokerConsumer({
      driver,
      options: deps.options,
      clock: this.clock,
      logger: deps.logger,
      workerId: deps.workerId,
      listeners: deps.listeners,
    });
    // Every process that may send ends the dialogs its targets end (no endpoint leak).
    for (const queue of brokerSetupQueues(deps.options)) this.consumer.registerInitiator(queue);
    this.doorbell = deps.options.doorbell
      ? new BrokerDoorbell({
          driver,
          sender: this.sender,
          queue: deps.options.doorbell,
          waitTimeoutMs: deps.options.waitTimeoutMs,
          logger: deps.logger,
          clock: this.clock,
        })
      : null;
  }

  queue(name: string): ResolvedBrokerQueue | undefined {
    return this.byName.get(name);
  }

  register(name: string, handler: BrokerHandler): void {
    const queue = this.required(name);
    // The pool was sized from the options before module init; a handler that only a factory
    // provider yields can raise maxReaders after that, and its extra readers would wait for a
    // connection that never comes.
    const needed =
      this.registeredReaders + queue.maxReaders + listenerConnections(this.options) + initiatorQueueCount(this.options);
    if (this.readerConnections !== null && needed > this.readerConnections) {
      throw new SqlQueueConfigError(
        `broker queue '${name}': its handler sets maxReaders ${queue.maxReaders} after the Service Broker reader pool was sized (${this.readerConnections} connections): set maxReaders under broker.queues['${name}'] (a handler from a factory provider is only known after the pool is open)`,
      );
    }
    this.consumer.register(queue, handler);
    this.consumed.push(queue);
    this.registeredReaders += queue.maxReaders;
  }

  async start(): Promise<void> {
    this.consumer.start();
    if (this.consume) {
      this.sweepTimer = this.clock.setInterval(() => void this.sweepJournal(), ATTEMPT_SWEEP_INTERVAL_MS);
    }
  }

  stop(timeoutMs: number): Promise<void> {
    this.sweepTimer?.cancel();
    this.sweepTimer = null;
    return this.consumer.stop(timeoutMs);
  }

  /**
   * Deletes attempt-journal rows of the queues this process consumes whose conversation is gone
   * (see sweepOrphanedAttempts), in batches; never throws (the next run tries again). Every
   * consuming process runs it hourly: the statement is cheap when there is nothing to delete.
   */
  async sweepJournal(): Promise<number> {
    if (this.sweeping) return 0;
    this.sweeping = true;
    let deleted = 0;
    try {
      for (const queue of this.consumed) {
        for (let batch = 0; batch < 10; batch++) {
          const [row] = await this.driver.query<{ Deleted: number }>(
            sweepOrphanedAttempts(this.options.schema, queue.queue),
            { queue: { type: 'nvarchar', value: queue.name } },
          );
          deleted += Number(row?.Deleted ?? 0);
          if (Number(row?.Deleted ?? 0) < 1_000) break;
        }
      }
      if (deleted > 0)
        this.logger.log(`Service Broker: removed ${deleted} attempt journal row(s) of ended conversations`);
    } catch (error) {
      this.logger.warn(`Service Broker: sweeping the attempt journal failed: ${(error as Error).message}`);
    } finally {
      this.sweeping = false;
    }
    return deleted;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.consumer.stop(0);
    if (!(await settleWithin(this.driver.close(), BROKER_CLOSE_TIMEOUT_MS))) {
      this.logger.warn(
        `Service Broker reader connections were still busy ${BROKER_CLOSE_TIMEOUT_MS} ms into shutdown (a handler ignoring its abort signal, or an unresponsive database); not waiting for them`,
      );
    }
  }

  snapshot(): BrokerSnapshot {
    return this.consumer.snapshot();
  }

  send(name: string, body: unknown, options?: { groupKey?: string; transaction?: unknown }): Promise<BrokerSent> {
    return this.sender.send(this.required(name), body, options);
  }

  listDeadMessages(name: string, page?: { limit?: number; afterId?: string | null }): Promise<BrokerDeadMessagePage> {
    return this.admin.listDeadMessages(this.required(name), page);
  }

  retryDeadMessages(name: string, ids: readonly string[] | 'all'): Promise<string[]> {
    return this.admin.retryDeadMessages(this.required(name), ids);
  }

  purgeDeadMessages(name: string, options?: { olderThanMs?: number }): Promise<number> {
    return this.admin.purgeDeadMessages(this.required(name), options);
  }

  stats(name: string): Promise<BrokerQueueStats> {
    return this.admin.brokerQueueFigures(this.required(name));
  }

  conversationEndpoints(): Promise<Record<string, number>> {
    return this.admin.conversationEndpointsByState();
  }

  health(name: string): Promise<BrokerHealthReading> {
    return readBrokerHealth(this.driver, this.options, name, this.consumer.snapshot(), this.clock.now());
  }

  private required(name: string): ResolvedBrokerQueue {
    const queue = this.byName.get(name);
    if (!queue)
      throw new SqlQueueConfigError(`'${String(name)}' is not a broker queue declared under the broker option`);
    return queue;
  }
}
