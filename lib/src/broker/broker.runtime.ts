import { systemClock, type Clock } from '../core/clock.js';
import { SqlQueueConfigError, SqlQueueValidationError } from '../core/errors.js';
import type { QueueEventListener } from '../core/events.js';
import type { JobHandler } from '../core/consumer/index.js';
import type { QueueLogger } from '../core/logger.js';
import { assertJobId } from '../core/producer/index.js';
import { settleWithin } from '../core/timeout.js';
import { assertInteger } from '../core/validation.js';
import type { MssqlQueueStore } from '../store/mssql/mssql.store.js';
import { BrokerAdmin } from './broker.admin.js';
import { BrokerConsumer } from './activation/index.js';
import { BrokerDoorbell } from './activation/index.js';
import { brokerDeadMessage, brokerJobHandler } from './reader/index.js';
import { brokerSetupQueues } from './broker.options.js';
import { readBrokerHealth } from './broker.health.js';
import { createMssqlBrokerDriver } from './driver/index.js';
import { endClosedConversation } from './reader/index.js';
import { BrokerSender } from './sender/index.js';
import {
  applyBrokerSetup,
  assessBrokerSetup,
  brokerBootDecision,
  brokerObservationQuery,
  parseBrokerObservation,
} from './setup/index.js';
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
 * How long close() waits for the reader pool: a reader stuck on an unresponsive database must
 * not hold the application's shutdown.
 */
export const BROKER_CLOSE_TIMEOUT_MS = 5_000;

export interface BrokerRuntimeDeps {
  store: MssqlQueueStore;
  options: ResolvedBrokerOptions;
  logger: QueueLogger;
  listeners: readonly QueueEventListener[];
  maxPayloadBytes: number;
  /** False in a producer-only process: no receivers of target queues, no activation listener. */
  consume: boolean;
  /** A receiver moved messages of broker queue `name` into its table queue: wake this process's handlers. */
  onMoved?(name: string): void;
  clock?: Clock;
}

/**
 * Connects the Service Broker transport: a reader pool, then the boot check of the broker
 * objects (setting them up when `setup` is 'auto'), then the parts that run.
 */
export async function createBrokerRuntime(deps: BrokerRuntimeDeps): Promise<BrokerRuntime> {
  const { options } = deps;
  // The listeners and initiator readers pin a connection each for their whole life; receivers
  // open connections of their own.
  const readerConnections = (deps.consume ? listenerConnections(options) : 0) + initiatorQueueCount(options);
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
  return new BrokerRuntime(driver, deps);
}

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
  // A warning setup does not cure (an existing queue's settings) is seen again after it: once is enough.
  const warned = new Set<string>();
  const warn = (warnings: readonly string[]) => {
    for (const warning of warnings.filter((w) => !warned.has(w))) {
      warned.add(warning);
      logger.warn(warning);
    }
  };
  let decision = brokerBootDecision(await observe(), options);
  if (decision.action === 'setup') {
    warn(decision.warnings);
    await applyBrokerSetup(driver, options, decision);
    logger.log(
      `Service Broker objects of ${options.queues.length} broker queue(s)${options.doorbell ? ' and the doorbell' : ''} set up (broker.setup: 'auto')`,
    );
    decision = brokerBootDecision(await observe(), options, true);
  }
  warn(decision.warnings);
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
  private readonly store: BrokerRuntimeDeps['store'];
  private readonly maxPayloadBytes: number;
  private readonly clock: Clock;
  private readonly logger: QueueLogger;
  private closed = false;

  readonly doorbell: BrokerDoorbell | null;

  constructor(
    private readonly driver: BrokerDriver,
    deps: BrokerRuntimeDeps,
  ) {
    this.options = deps.options;
    this.maxPayloadBytes = deps.maxPayloadBytes;
    this.store = deps.store;
    this.logger = deps.logger;
    const clock = (this.clock = deps.clock ?? systemClock);
    this.byName = new Map(deps.options.queues.map((queue) => [queue.name, queue]));
    this.sender = new BrokerSender({
      driver,
      schema: deps.options.schema,
      maxPayloadBytes: deps.maxPayloadBytes,
      unkeyedDialogs: deps.options.unkeyedDialogs,
      dialogRecycleMs: deps.options.dialogRecycleMs,
      logger: deps.logger,
    });
    this.admin = new BrokerAdmin(driver);
    this.consumer = new BrokerConsumer({
      driver,
      options: deps.options,
      clock,
      logger: deps.logger,
      listeners: deps.listeners,
      maxBodyBytes: deps.maxPayloadBytes,
      onMoved: (name) => deps.onMoved?.(name),
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
          clock,
        })
      : null;
  }

  queue(name: string): ResolvedBrokerQueue | undefined {
    return this.byName.get(name);
  }

  register(name: string, options: { maxAttempts: number }): void {
    this.consumer.register(this.required(name), options.maxAttempts);
  }

  jobHandler(name: string, handler: BrokerHandler): JobHandler {
    return brokerJobHandler({
      queue: this.required(name),
      handler,
      maxBodyBytes: this.maxPayloadBytes,
      endConversation: async (handle) => {
        await this.driver.query(endClosedConversation(), { handle: { type: 'uniqueidentifier', value: handle } });
      },
    });
  }

  async start(): Promise<void> {
    this.consumer.start();
  }

  stop(timeoutMs: number): Promise<void> {
    return this.consumer.stop(timeoutMs);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.consumer.stop(0);
    if (!(await settleWithin(this.driver.close(), BROKER_CLOSE_TIMEOUT_MS))) {
      this.logger.warn(
        `Service Broker reader connections were still busy ${BROKER_CLOSE_TIMEOUT_MS} ms into shutdown (an unresponsive database?); not waiting for them`,
      );
    }
  }

  snapshot(): BrokerSnapshot {
    return this.consumer.snapshot();
  }

  send(name: string, body: unknown, options?: { groupKey?: string; transaction?: unknown }): Promise<BrokerSent> {
    return this.sender.send(this.required(name), body, options);
  }

  async listDeadMessages(
    name: string,
    page: { limit?: number; afterId?: string | null } = {},
  ): Promise<BrokerDeadMessagePage> {
    const queue = this.required(name);
    const limit = assertInteger('listDeadMessages limit', page.limit ?? 50, 1, 1000, SqlQueueValidationError);
    const afterId = page.afterId === undefined || page.afterId === null ? null : assertJobId(page.afterId);
    const { jobs, nextAfterId } = await this.store.listDead(name, { limit, afterId });
    return { messages: jobs.map((job) => brokerDeadMessage(queue, job)), nextAfterId };
  }

  async stats(name: string): Promise<BrokerQueueStats> {
    const queue = this.required(name);
    const [messagesWaiting, table] = await Promise.all([this.admin.messagesWaiting(queue), this.store.stats(name)]);
    return { messagesWaiting, dead: table.dead };
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
