import { readersToStart, shouldRetireAfterEmptyClaim } from '../../core/consumer/index.js';
import { PollBackoff } from '../../core/backoff.js';
import { systemClock, type Clock } from '../../core/clock.js';
import { SqlQueueConfigError } from '../../core/errors.js';
import { safeEmit, type QueueEventListener } from '../../core/events.js';
import { ThrottledErrorLog, type QueueLogger } from '../../core/logger.js';
import { settleWithin, withTimeout } from '../../core/timeout.js';
import { BrokerActivationListener, type BrokerListenerDeps } from './broker.listener.js';
import { BrokerInitiatorReader } from '../sender/index.js';
import { BrokerReceiver } from '../reader/index.js';
import { brokerEventNotificationBatch } from '../setup/index.js';
import type {
  BrokerActivationSource,
  BrokerDriver,
  BrokerQueueSnapshot,
  BrokerReaderLoop,
  BrokerSnapshot,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from '../broker.types.js';

/** How long a failing reader waits before its next try: doubles from the first to the last, with jitter. */
const ERROR_BACKOFF_MIN_MS = 250;
const ERROR_BACKOFF_MAX_MS = 10_000;
/** Shutdown waits this much past its timeout for readers that were told to abort. */
const STOP_GRACE_MS = 5_000;

interface RunningReader {
  reader: BrokerReaderLoop;
  done: Promise<void>;
}

export interface BrokerQueueReadersDeps {
  clock: Clock;
  logger: QueueLogger;
  listeners: readonly QueueEventListener[];
  random?: () => number;
}

/**
 * The readers of one broker queue in this process (its receivers, or an initiator queue's
 * reader), between a minimum and a maximum by the table queue's activation rule
 * (core/consumer/activation.ts, seed 003): an activation (a QUEUE_ACTIVATION notification or the slow
 * poll) starts one reader while fewer than the maximum run, and a reader whose wait came back
 * empty retires while more than the minimum run.
 */
export class BrokerQueueReaders {
  private readers = 0;
  private readonly running = new Set<RunningReader>();
  private stopping = false;
  private stopped: Promise<void> | null = null;
  private started = false;
  private lastActivationAt: number | null = null;
  /** Error backoff pauses in progress; shutdown aborts them. */
  private readonly pauses = new Set<AbortController>();
  private readonly errors: ThrottledErrorLog;
  /** Since when every round of every reader failed (engine clock ms; null after any success), and the last error. */
  private failingSince: number | null = null;
  private lastError: string | null = null;

  /**
   * `activates: false` makes a fixed pool of minReaders that ignores activations (the
   * initiator queue's reader, which only ends conversations).
   */
  constructor(
    private readonly deps: BrokerQueueReadersDeps,
    readonly name: string,
    private readonly limits: { minReaders: number; maxReaders: number; activates: boolean },
    private readonly createReader: () => BrokerReaderLoop,
  ) {
    this.errors = new ThrottledErrorLog(deps.logger, `reading broker queue '${name}'`, () => deps.clock.now());
  }

  get readerCount(): number {
    return this.readers;
  }

  /** Starts minReaders readers. */
  start(): void {
    if (this.started || this.stopping) return;
    this.started = true;
    for (let i = 0; i < this.limits.minReaders; i++) this.addReader('start');
  }

  /** A notification or the poll says a reader would have work: start one, never above maxReaders. */
  activate(source: BrokerActivationSource): void {
    if (!this.started || this.stopping || !this.limits.activates) return;
    this.lastActivationAt = this.deps.clock.now();
    if (readersToStart(this.readers, this.limits.maxReaders, 1) === 0) return;
    this.addReader(source === 'notification' ? 'activation' : 'poll');
    safeEmit(this.deps.listeners, 'brokerActivated', { queue: this.name, source });
  }

  snapshot(): Pick<
    BrokerQueueSnapshot,
    'receivers' | 'busyReceivers' | 'minReceivers' | 'maxReceivers' | 'lastActivationAt' | 'failingSince' | 'lastError'
  > {
    let busy = 0;
    for (const { reader } of this.running) if (reader.busy) busy++;
    return {
      receivers: this.readers,
      busyReceivers: busy,
      minReceivers: this.limits.minReaders,
      maxReceivers: this.limits.maxReaders,
      lastActivationAt: this.lastActivationAt,
      failingSince: this.failingSince,
      lastError: this.failingSince === null ? null : this.lastError,
    };
  }

  private addReader(reason: 'start' | 'activation' | 'poll'): void {
    let reader: BrokerReaderLoop;
    try {
      reader = this.createReader();
    } catch (error) {
      this.deps.logger.error(
        `broker queue '${this.name}': could not create a reader: ${describe(error)}`,
        error instanceof Error ? error.stack : undefined,
      );
      return;
    }
    this.readers++;
    safeEmit(this.deps.listeners, 'brokerReceiversChanged', { queue: this.name, receivers: this.readers, reason });
    const entry = { reader } as RunningReader;
    entry.done = this.loop(reader).finally(() => this.running.delete(entry));
    this.running.add(entry);
  }

  private async loop(reader: BrokerReaderLoop): Promise<void> {
    const backoff = new PollBackoff(ERROR_BACKOFF_MIN_MS, ERROR_BACKOFF_MAX_MS, this.deps.random ?? Math.random);
    try {
      while (!this.stopping) {
        let outcome: 'empty' | 'handled' | 'stopped';
        try {
          outcome = await reader.runOnce();
        } catch (error) {
          if (this.stopping) return;
          // The database is unreachable or the statement failed: the transaction is gone (the
          // reader rolled back or lost the connection), the message is still queued. Try again
          // after a pause, so a dead server is not hammered by every reader.
          const pause = backoff.next();
          this.errors.failed(error, pause);
          this.failingSince ??= this.deps.clock.now();
          this.lastError = describe(error);
          await this.pause(pause);
          continue;
        }
        backoff.reset();
        this.errors.succeeded();
        this.failingSince = null;
        if (outcome === 'stopped') return;
        // Seed 003: a reader whose wait came back empty retires while more than the minimum run
        // (checked and left in the same turn, so two empty readers cannot both retire past it).
        if (outcome === 'empty' && shouldRetireAfterEmptyClaim(this.readers, this.limits.minReaders)) return;
      }
    } finally {
      this.readers--;
      safeEmit(this.deps.listeners, 'brokerReceiversChanged', {
        queue: this.name,
        receivers: this.readers,
        reason: this.stopping ? 'stop' : 'retire',
      });
    }
  }

  private async pause(ms: number): Promise<void> {
    const pause = new AbortController();
    this.pauses.add(pause);
    try {
      await this.deps.clock.sleep(ms, pause.signal);
    } finally {
      this.pauses.delete(pause);
    }
  }

  /**
   * No new readers; each reader cancels its idle WAITFOR or lets its round finish. Resolves when
   * every loop has ended, or `timeoutMs` plus a grace period later (a reader stuck on a dead
   * connection).
   */
  stop(timeoutMs: number): Promise<void> {
    this.stopped ??= this.shutDown(timeoutMs);
    return this.stopped;
  }

  private async shutDown(timeoutMs: number): Promise<void> {
    this.stopping = true;
    for (const pause of this.pauses) pause.abort();
    const loops: Promise<unknown>[] = [];
    for (const { reader, done } of this.running) {
      loops.push(done);
      try {
        // A rejection of stop() must not keep shutdown from the other readers.
        void Promise.resolve(reader.stop()).catch((error: unknown) => {
          this.deps.logger.warn(`broker queue '${this.name}': stopping a reader failed: ${describe(error)}`);
        });
      } catch (error) {
        this.deps.logger.warn(`broker queue '${this.name}': stopping a reader failed: ${describe(error)}`);
      }
    }
    if (!(await settleWithin(Promise.all(loops), timeoutMs + STOP_GRACE_MS))) {
      this.deps.logger.warn(
        `broker queue '${this.name}': a reader did not stop within ${timeoutMs + STOP_GRACE_MS} ms (database unresponsive?); its transaction ends with its connection`,
      );
    }
  }
}

export interface BrokerConsumerDeps {
  driver: BrokerDriver;
  options: ResolvedBrokerOptions;
  /** Engine timers (poll, backoff); tests pass a fake clock. Default: the system clock. */
  clock?: Clock;
  logger: QueueLogger;
  listeners: readonly QueueEventListener[];
  random?: () => number;
  /** The most bytes of a message body a move keeps (the module's maxPayloadBytes). */
  maxBodyBytes: number;
  /** Messages of `queue` became jobs in this process's move: wake its handlers. */
  onMoved(queue: string): void;
  /** Makes one receiver of a consumed queue. Default: a BrokerReceiver on `driver`. */
  createReceiver?: (queue: ResolvedBrokerQueue, maxAttempts: number) => BrokerReaderLoop;
  /** Makes the reader of an initiator queue (EndDialog and Error from targets). Default: a BrokerInitiatorReader. */
  createInitiatorReader?: (queue: ResolvedBrokerQueue) => BrokerReaderLoop;
  /** Creates a queue's missing event notifications (setup 'auto'). Default: the setup's event notification batch. */
  recreateNotifications?: (queue: ResolvedBrokerQueue) => Promise<void>;
  /** Replaces the activation listener (tests). */
  createListener?: (deps: BrokerListenerDeps) => Pick<BrokerActivationListener, 'start' | 'stop' | 'snapshot'>;
}

/**
 * All broker reading of this process: the receivers of each consumed queue (they move its
 * messages into its table queue, whose readers run the handlers), the initiator queues'
 * readers, and the activation listener (one per process, run while any queue is consumed) that
 * starts receivers on QUEUE_ACTIVATION notifications and a slow poll.
 */
export class BrokerConsumer {
  private readonly clock: Clock;
  private readonly consumed = new Map<string, { queue: ResolvedBrokerQueue; readers: BrokerQueueReaders }>();
  private readonly initiators = new Map<string, BrokerQueueReaders>();
  private listener: Pick<BrokerActivationListener, 'start' | 'stop' | 'snapshot'> | null = null;
  private state: 'new' | 'running' | 'stopping' | 'stopped' = 'new';
  private stopped: Promise<void> | null = null;

  constructor(private readonly deps: BrokerConsumerDeps) {
    this.clock = deps.clock ?? systemClock;
  }

  /**
   * Consumes a broker queue from start() on: its receivers move messages into its table queue,
   * as jobs whose maxAttempts defaults to `maxAttempts`. Call before start(), once per queue.
   */
  register(queue: ResolvedBrokerQueue, maxAttempts: number): void {
    if (this.state !== 'new')
      throw new SqlQueueConfigError(`broker queue '${queue.name}': register() must come before start()`);
    if (this.consumed.has(queue.name))
      throw new SqlQueueConfigError(`broker queue '${queue.name}' has two handlers: keep one`);
    const create = this.deps.createReceiver ?? ((q, attempts) => this.createReceiver(q, attempts));
    const readers = new BrokerQueueReaders(
      this.readerDeps(),
      queue.name,
      { minReaders: queue.minReceivers, maxReaders: queue.maxReceivers, activates: true },
      () => create(queue, maxAttempts),
    );
    this.consumed.set(queue.name, { queue, readers });
  }

  /**
   * Runs one reader on `queue`'s initiator queue (once per initiator queue, however many broker
   * queues share it), so EndDialog and Error from the target end our side of the dialogs. A
   * process that only sends needs it as much as one that consumes. Before start().
   */
  registerInitiator(queue: ResolvedBrokerQueue): void {
    if (this.state !== 'new')
      throw new SqlQueueConfigError(`broker queue '${queue.name}': registerInitiator() must come before start()`);
    const create =
      this.deps.createInitiatorReader ??
      ((q: ResolvedBrokerQueue) =>
        new BrokerInitiatorReader({
          driver: this.deps.driver,
          schema: this.deps.options.schema,
          queue: q,
          waitTimeoutMs: this.deps.options.waitTimeoutMs,
          logger: this.deps.logger,
        }));
    const key = `${queue.initiatorQueue.schema}.${queue.initiatorQueue.name}`;
    if (this.initiators.has(key)) return;
    this.initiators.set(
      key,
      new BrokerQueueReaders(
        this.readerDeps(),
        `${queue.name} (initiator queue ${key})`,
        {
          minReaders: 1,
          maxReaders: 1,
          activates: false,
        },
        () => create(queue),
      ),
    );
  }

  start(): void {
    if (this.state !== 'new') return;
    this.state = 'running';
    for (const { readers } of this.consumed.values()) readers.start();
    for (const readers of this.initiators.values()) readers.start();
    if (this.consumed.size === 0) return;
    const listenerDeps: BrokerListenerDeps = {
      driver: this.deps.driver,
      options: this.deps.options,
      clock: this.clock,
      logger: this.deps.logger,
      listeners: this.deps.listeners,
      random: this.deps.random,
      queues: [...this.consumed.values()].map((c) => c.queue),
      activate: (name, source) => this.consumed.get(name)?.readers.activate(source),
      readersOf: (name) => this.consumed.get(name)?.readers.readerCount ?? 0,
      recreateNotifications: this.deps.recreateNotifications ?? ((queue) => this.recreateNotifications(queue)),
    };
    this.listener = this.deps.createListener?.(listenerDeps) ?? new BrokerActivationListener(listenerDeps);
    this.listener.start();
  }

  /**
   * Stops activation and the poll first (the listener's idle WAITFOR is cancelled and its
   * transaction committed), then every reader at once: idle waits are cancelled, moves in
   * flight finish. A second call waits for the first.
   */
  stop(timeoutMs: number): Promise<void> {
    this.stopped ??= this.shutDown(timeoutMs);
    return this.stopped;
  }

  private async shutDown(timeoutMs: number): Promise<void> {
    this.state = 'stopping';
    if (this.listener) await this.listener.stop();
    await Promise.all([
      ...[...this.consumed.values()].map(({ readers }) => readers.stop(timeoutMs)),
      ...[...this.initiators.values()].map((readers) => readers.stop(timeoutMs)),
    ]);
    this.state = 'stopped';
  }

  /** Every broker queue of the options: receivers here, activation, and what the listener saw. */
  snapshot(): BrokerSnapshot {
    const listener = this.listener?.snapshot() ?? null;
    const queues: BrokerQueueSnapshot[] = this.deps.options.queues.map((queue) => {
      const consumed = this.consumed.get(queue.name);
      const seen = listener?.queues.get(queue.name);
      return {
        queue: queue.name,
        consumed: consumed !== undefined,
        ...(consumed?.readers.snapshot() ?? {
          receivers: 0,
          busyReceivers: 0,
          minReceivers: queue.minReceivers,
          maxReceivers: queue.maxReceivers,
          lastActivationAt: null,
          failingSince: null,
          lastError: null,
        }),
        disabledSeen: seen?.disabledSeen ?? false,
        notificationProblem: seen?.notificationProblem ?? null,
      };
    });
    return {
      running: this.state === 'running',
      listenerLastLoopAt: this.state === 'running' ? (listener?.lastLoopAt ?? null) : null,
      queues,
    };
  }

  private createReceiver(queue: ResolvedBrokerQueue, maxAttempts: number): BrokerReaderLoop {
    const { driver, options, logger, listeners } = this.deps;
    return new BrokerReceiver({
      driver,
      schema: options.schema,
      queue,
      waitTimeoutMs: options.waitTimeoutMs,
      maxAttempts,
      maxBodyBytes: this.deps.maxBodyBytes,
      logger,
      listeners,
      onMoved: () => this.deps.onMoved(queue.name),
    });
  }

  /** Runs the setup's event notification batch for `queue` on the shared pool, bounded. */
  private async recreateNotifications(queue: ResolvedBrokerQueue): Promise<void> {
    await withTimeout(
      this.deps.driver.query(brokerEventNotificationBatch(queue, this.deps.options)),
      Math.max(5_000, this.deps.options.pollIntervalMs),
      `recreating the event notifications of broker queue '${queue.name}'`,
    );
  }

  private readerDeps(): BrokerQueueReadersDeps {
    return { clock: this.clock, logger: this.deps.logger, listeners: this.deps.listeners, random: this.deps.random };
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
