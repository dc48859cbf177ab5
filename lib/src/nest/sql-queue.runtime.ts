import { Logger } from '@nestjs/common';
import { systemClock } from '../core/clock.js';
import { defaultWorkerId } from '../core/consumer/index.js';
import { ThroughputRecorder } from '../core/throughput/index.js';
import type { QueueEventListener } from '../core/events.js';
import type { QueueOptions } from '../core/options.js';
import { QueueProducerCore } from '../core/producer/index.js';
import { settleWithin } from '../core/timeout.js';
import { NO_TRACING, type QueueTracer } from '../core/tracing.js';
import type { QueueStore } from '../core/queue-store.js';
import { DEFAULT_MAX_ATTEMPTS } from '../core/validation.js';
import { RemoteWaker, WakeBus, WakeChannel, type WakeListen } from '../core/wake.js';
import { FinishWatch } from '../core/producer/index.js';
import { createQueueStore } from '../store/create-store.js';
import type { ResolvedModuleOptions } from './sql-queue.options.js';
import type { ResolvedHandler } from './queue-handler.explorer.js';
import type { QueueSetting } from '../core/types.js';
import type { BrokerRuntimeApi } from '../broker/broker.types.js';
import type { MssqlQueueStore } from '../store/mssql/mssql.store.js';
import { BROKER_NEEDS_SQL_SERVER } from './broker-handlers.js';
import { SqlQueueConfigError } from '../core/errors.js';
import { scheduleUpsertOf } from '../core/schedules/index.js';
import { loadQueueTracer } from '../tracing/tracing.loader.js';

const STORE_CLOSE_TIMEOUT_MS = 5_000;
const THROUGHPUT_FLUSH_TIMEOUT_MS = 2_000;
/** Single enqueues waiting to share a statement get this long at shutdown to be sent. */
const ENQUEUE_FLUSH_TIMEOUT_MS = 5_000;

/**
 * Everything one SqlQueueModule owns at run time. Built by an async provider, so a bad
 * option, an unreachable database or a schema mismatch fails the application's boot.
 */
export class SqlQueueRuntime {
  /**
   * Handler-level options of this application's queues: declared handlers before the database
   * is reached, every handler (factory providers too) at module init.
   */
  readonly handlerOptions = new Map<string, QueueOptions>();
  readonly wakeBus = new WakeBus();
  readonly remoteWaker: RemoteWaker | null;
  /** The process's one wake-up connection, shared by the readers and waitFor(). */
  readonly wakeChannel: WakeChannel;
  /** Wakes waitFor() when its job finishes, here or (through NOTIFY) elsewhere. */
  readonly finishWatch: FinishWatch;
  /** Where the remote waker rings: the store's notify, or the broker doorbell's ring. */
  private readonly wakeTarget: Pick<QueueStore, 'notify'>;
  readonly producer: QueueProducerCore;
  readonly workerId: string;
  /** Spans of enqueues and handlers (claims and reaper runs if asked for): the `tracing` option. */
  readonly tracer: QueueTracer;
  /** Adds this process's job outcomes to the database's per-minute counts (the `throughput` option). */
  readonly throughput: ThroughputRecorder | null;
  /** The Service Broker transport, when the `broker` option declares queues (SQL Server only). */
  broker: BrokerRuntimeApi | null = null;
  /** Queue settings this process recorded (consumers only). */
  private readonly recorded = new Map<string, string>();
  private closed = false;

  constructor(
    readonly options: ResolvedModuleOptions,
    readonly store: QueueStore,
    readonly logger: Logger,
    { tracer = NO_TRACING, workerId }: { tracer?: QueueTracer; workerId?: string } = {},
  ) {
    this.workerId = workerId ?? options.consumer.workerId ?? defaultWorkerId();
    this.tracer = tracer;
    this.wakeTarget = { notify: store.notify ? (queue) => store.notify!(queue) : undefined };
    // PostgreSQL rings through the store (NOTIFY); SQL Server through the Service Broker
    // doorbell, once connectBroker has it (broker.doorbell). Without either, nothing is sent.
    this.remoteWaker =
      options.wakeups.enabled && (store.notify || options.broker?.doorbell)
        ? new RemoteWaker(this.wakeTarget, options.wakeups.intervalMs, logger)
        : null;
    this.wakeChannel = new WakeChannel(() => this.channelListen());
    // Only NOTIFY reaches every process: a doorbell ring wakes a single listener. PGlite is one
    // process: its in-process wake-up says it all.
    const oneProcess = 'pglite' in options.connection;
    this.finishWatch = new FinishWatch({
      broadcast: options.wakeups.enabled && store.notify && !oneProcess ? (name) => store.notify!(name) : null,
      listen: store.notify ? (this.wakeChannel.listen ?? null) : null,
      logger,
    });
    this.addListener(this.finishWatch);
    this.producer = new QueueProducerCore(
      store,
      {
        maxPayloadBytes: options.maxPayloadBytes,
        maxAttemptsFor: (queue) => this.defaultMaxAttempts(queue),
        enqueueBatching: options.enqueueBatching,
        tracer,
        finishWatch: this.finishWatch,
      },
      this.wakeBus,
      this.remoteWaker,
    );
    this.throughput = options.throughput.enabled
      ? new ThroughputRecorder({
          store,
          clock: systemClock,
          logger,
          flushIntervalMs: options.throughput.flushIntervalMs,
        })
      : null;
    if (this.throughput) {
      this.addListener(this.throughput);
      this.throughput.start();
    }
  }

  /** Connected at boot (the `broker` option): its doorbell, if any, rings for table queues. */
  useBroker(broker: BrokerRuntimeApi): void {
    this.broker = broker;
    const doorbell = broker.doorbell;
    if (doorbell && !this.wakeTarget.notify) this.wakeTarget.notify = (queue) => doorbell.ring(queue);
  }

  /**
   * Where wake-ups from other processes arrive: PostgreSQL's LISTEN (also with wake-ups off, for
   * producers that send them), or the Service Broker doorbell while wake-ups are on.
   */
  private channelListen(): WakeListen | undefined {
    if (this.store.listen) return (onWake) => this.store.listen!(onWake);
    const doorbell = this.broker?.doorbell;
    return doorbell && this.options.wakeups.enabled ? (onWake) => doorbell.listen(onWake) : undefined;
  }

  /** Live list: listeners added later (metrics) see every event from then on. */
  get listeners(): QueueEventListener[] {
    return this.options.listeners;
  }

  addListener(listener: QueueEventListener): void {
    this.options.listeners.push(listener);
  }

  /**
   * Records the maxAttempts this process's consumers apply, so that every enqueue of the queue
   * without its own value stores it, in a producer-only process too. Consumers only: what a
   * producer-only process knows of a queue may be older or partial. Repeats nothing recorded.
   */
  async recordQueueSettings(queues: readonly QueueSetting[]): Promise<void> {
    if (!this.options.consumer.enabled) return;
    const signature = (setting: QueueSetting) =>
      `${setting.maxAttempts}/${setting.groupOnDead ?? 'continue'}/${JSON.stringify(setting.limits ?? null)}`;
    const changed = queues.filter((queue) => this.recorded.get(queue.queue) !== signature(queue));
    if (changed.length === 0) return;
    await this.store.recordQueueSettings(
      changed.map(({ queue, maxAttempts, groupOnDead, limits }) => ({ queue, maxAttempts, groupOnDead, limits })),
    );
    for (const setting of changed) this.recorded.set(setting.queue, signature(setting));
  }

  /**
   * This process's own value, for a queue whose consumers recorded none (the enqueue statement
   * prefers theirs): handler over module over default, as the consumer resolves it.
   */
  defaultMaxAttempts(queue: string): number {
    return (
      this.handlerOptions.get(queue)?.maxAttempts ?? this.options.queues[queue]?.maxAttempts ?? DEFAULT_MAX_ATTEMPTS
    );
  }

  /**
   * A boot check failed: Nest never hands out a context whose init failed, so nobody could
   * close this pool later. Closes it, then rethrows the check's error.
   */
  async failBoot(error: unknown): Promise<never> {
    await this.close().catch(() => undefined);
    throw error;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // First, while the store and the wake-ups still work: enqueues already accepted are stored.
    await this.producer.close(ENQUEUE_FLUSH_TIMEOUT_MS);
    this.remoteWaker?.close();
    await this.finishWatch.close();
    await this.throughput?.stop(THROUGHPUT_FLUSH_TIMEOUT_MS);
    await this.broker?.close().catch((error: unknown) => {
      this.logger.warn(`closing the Service Broker reader pool failed: ${(error as Error).message}`);
    });
    // Closing a pool waits for every connection checked out; one stuck on an unresponsive
    // database (until queryTimeoutMs) must not hold the application's shutdown.
    if (!(await settleWithin(this.store.close(), STORE_CLOSE_TIMEOUT_MS))) {
      this.logger.warn(
        `database connections were still busy ${STORE_CLOSE_TIMEOUT_MS} ms into shutdown (database unresponsive?); not waiting for them`,
      );
    }
  }
}

/**
 * Connects, migrates and records the declared handlers' queue settings; the options are
 * resolved and every check without a database passed.
 */
export async function createSqlQueueRuntime(
  options: ResolvedModuleOptions,
  handlers: readonly ResolvedHandler[],
): Promise<SqlQueueRuntime> {
  const logger = new Logger('SqlQueue');
  // Before connecting: the tracer's spans name this process (messaging.client.id) by its worker id.
  const workerId = options.consumer.workerId ?? defaultWorkerId();
  const tracer = await loadQueueTracer(options.tracing, workerId, logger);
  const store = await createQueueStore(options.connection, {
    schema: options.schema,
    onBackgroundError: (error) => logger.warn(`idle database connection failed: ${error.message}`),
  });
  try {
    const status = await store.migrate(options.migrations);
    if (options.migrations !== 'off') {
      logger.log(
        `${store.dialect} schema "${options.schema}" at version ${status.current} (migrations: ${options.migrations})`,
      );
    }
  } catch (error) {
    await store.close().catch(() => undefined);
    throw error;
  }
  try {
    await upsertOptionSchedules(store, options);
  } catch (error) {
    await store.close().catch(() => undefined);
    throw error;
  }
  const runtime = new SqlQueueRuntime(options, store, logger, { tracer, workerId });
  // useBroker, not a plain assignment: it also points the producer's wake-ups at the doorbell.
  if (options.broker)
    runtime.useBroker(await connectBroker(runtime, options).catch((error: unknown) => runtime.failBoot(error)));
  for (const handler of handlers) runtime.handlerOptions.set(handler.queue, handler.options);
  // Before any provider's init can enqueue: a new handler maxAttempts applies from the first job.
  await runtime
    .recordQueueSettings(handlers.map((handler) => handler.resolved))
    .catch((error: unknown) => runtime.failBoot(error));
  return runtime;
}

/**
 * Loads the Service Broker transport (and with it `mssql`) only when the `broker` option is
 * given; it checks or sets up the broker objects, as `setup` says, before the app starts.
 */
async function connectBroker(runtime: SqlQueueRuntime, options: ResolvedModuleOptions): Promise<BrokerRuntimeApi> {
  if (runtime.store.dialect !== 'mssql') {
    throw new SqlQueueConfigError(BROKER_NEEDS_SQL_SERVER);
  }
  const { createBrokerRuntime } = await import('../broker/broker.runtime.js');
  return createBrokerRuntime({
    store: runtime.store as MssqlQueueStore,
    options: options.broker!,
    logger: runtime.logger,
    listeners: runtime.listeners,
    maxPayloadBytes: options.maxPayloadBytes,
    consume: options.consumer.enabled,
    // Moved messages are jobs this process's handlers claim at once (others poll, or wake on
    // the doorbell's rings).
    onMoved: (queue) => runtime.wakeBus.wake(queue),
  });
}

/**
 * The module's `schedules` option, upserted at every boot (a changed cron or payload takes
 * effect; an unchanged timing keeps its next run), and with `pruneSchedules` the schedules an
 * earlier boot's option defined and this one does not. Schedules made through the API stay.
 */
async function upsertOptionSchedules(store: QueueStore, options: ResolvedModuleOptions): Promise<void> {
  const entries = Object.entries(options.schedules);
  if (entries.length === 0 && !options.pruneSchedules) return;
  const { now } = await store.scheduleDueIn();
  const items = entries.map(([id, valid]) => scheduleUpsertOf(id, valid, 'options', now));
  await store.upsertSchedules(items, options.pruneSchedules ? 'options' : undefined);
}
