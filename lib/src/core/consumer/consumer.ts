import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { SqlQueueConfigError } from '../errors.js';
import type { JobHandler } from './handler.js';
import type { ResolvedQueueOptions } from '../options.js';
import { QueueConsumer, type QueueConsumerDeps, type QueueConsumerSnapshot } from './queue-consumer.js';
import { settleWithin } from '../timeout.js';
import { cancelWakeName, canceledQueueOf, type WakeBus } from '../wake.js';

const UNLISTEN_TIMEOUT_MS = 5_000;

export interface ConsumerDeps extends QueueConsumerDeps {
  wakeBus: WakeBus;
  /** Listen for wake-ups from other processes when the store offers a channel (default true). */
  listenForWakeups?: boolean;
  /** Another wake-up channel than the store's (SQL Server's Service Broker doorbell). */
  listen?: (onWake: (queue: string) => void) => Promise<() => Promise<void>>;
}

export interface ConsumerSnapshot {
  running: boolean;
  startedAt: number | null;
  queues: QueueConsumerSnapshot[];
}

/** host:pid:random — unique per process start, readable in job rows and attempt history. */
export function defaultWorkerId(): string {
  return `${hostname()}:${process.pid}:${randomBytes(3).toString('hex')}`;
}

/** null as none; a group of options (the flow limits) as its set fields, e.g. {concurrencyPerKey: 2}. */
function describeOptionValue(value: unknown): string {
  if (value === null) return 'none';
  if (typeof value !== 'object') return String(value);
  const set = Object.entries(value as Record<string, unknown>).filter(([, field]) => field !== null);
  return `{${set.map(([name, field]) => `${name}: ${typeof field === 'object' ? JSON.stringify(field) : String(field)}`).join(', ')}}`;
}

/**
 * The effective options a queue runs with, as `name=value` pairs named like the options a user
 * writes (the backoff function is left out).
 */
function describeQueueOptions(options: ResolvedQueueOptions): string {
  return Object.entries(options)
    .filter(([name, value]) => name !== 'queue' && typeof value !== 'function')
    .map(([name, value]) => `${name}=${describeOptionValue(value)}`)
    .join(', ');
}

/**
 * All queues consumed by this process. Framework-free: the Nest consumer host builds one from
 * discovered handlers, and the failure drills drive one directly in child processes.
 */
export class SqlQueueConsumer {
  private readonly queues = new Map<string, QueueConsumer>();
  private readonly unsubscribes: (() => void)[] = [];
  private stopListening: (() => Promise<void>) | null = null;
  private state: 'idle' | 'running' | 'stopping' | 'stopped' = 'idle';
  private stopped: Promise<void> | null = null;
  private startedAt: number | null = null;

  constructor(private readonly deps: ConsumerDeps) {}

  register(options: ResolvedQueueOptions, handler: JobHandler): void {
    if (this.state !== 'idle') throw new SqlQueueConfigError('handlers must be registered before the consumer starts');
    if (this.queues.has(options.queue)) {
      throw new SqlQueueConfigError(`queue '${options.queue}' already has a handler in this process`);
    }
    const consumer = new QueueConsumer(this.deps, options, handler);
    this.checkTransactionalPool([...this.queues.values(), consumer]);
    this.queues.set(options.queue, consumer);
  }

  /**
   * Each running transactional handler holds a pooled connection until it commits: with as many
   * of them as the pool has connections less two, claims, heartbeats and completions would wait
   * for a free one, and leases would run out.
   */
  private checkTransactionalPool(consumers: readonly QueueConsumer[]): void {
    const poolSize = this.deps.store.poolSize;
    const transactional = consumers.filter((consumer) => consumer.options.transactional);
    if (poolSize === null || poolSize === undefined || transactional.length === 0) return;
    const held = transactional.reduce((sum, consumer) => sum + consumer.options.maxReaders, 0);
    if (held + 2 > poolSize) {
      throw new SqlQueueConfigError(
        `queues with transactional: true (${transactional.map((c) => `'${c.queue}'`).join(', ')}) may run ${held} handler(s) at once in this process (their maxReaders), each holding a connection until it commits, and the store's pool has ${poolSize}: give the pool at least ${held + 2} (connection.poolSize; claims, heartbeats and completions need two more) or lower maxReaders`,
      );
    }
  }

  get queueNames(): string[] {
    return [...this.queues.keys()];
  }

  async start(): Promise<void> {
    if (this.state !== 'idle') return;
    this.state = 'running';
    this.startedAt = this.deps.clock.now();
    for (const consumer of this.queues.values()) {
      this.unsubscribes.push(this.deps.wakeBus.subscribe(consumer.queue, () => consumer.wake()));
      this.unsubscribes.push(this.deps.wakeBus.subscribe(cancelWakeName(consumer.queue), () => consumer.cancelWake()));
    }
    const listen = this.deps.listen ?? this.deps.store.listen?.bind(this.deps.store);
    if (this.queues.size > 0 && this.deps.listenForWakeups !== false && listen) {
      try {
        this.stopListening = await listen((name) => {
          const canceled = canceledQueueOf(name);
          if (canceled === null) this.queues.get(name)?.wake();
          else this.queues.get(canceled)?.cancelWake();
        });
      } catch (error) {
        // Wake-ups are an optimization; polling still finds the work.
        this.deps.logger.warn(`cross-process wake-ups unavailable, relying on polling: ${(error as Error).message}`);
      }
      // stop() was called while LISTEN connected: it could not close what did not exist yet.
      if (this.state !== 'running') {
        await this.unlisten();
        return;
      }
    }
    for (const consumer of this.queues.values()) {
      consumer.start();
      this.deps.logger.log(
        `consuming queue '${consumer.queue}' as worker ${this.deps.workerId}: ${describeQueueOptions(consumer.options)}`,
      );
    }
  }

  /** Graceful: stop claiming, drain running handlers up to `timeoutMs`, abort the rest. */
  stop(timeoutMs: number): Promise<void> {
    // A second call waits for the first: its caller may close the pool next.
    this.stopped ??= this.shutDown(timeoutMs);
    return this.stopped;
  }

  private async shutDown(timeoutMs: number): Promise<void> {
    if (this.state !== 'running') {
      this.state = 'stopped';
      return;
    }
    this.state = 'stopping';
    for (const unsubscribe of this.unsubscribes.splice(0)) unsubscribe();
    const results = await Promise.all(
      [...this.queues.values()].map(async (consumer) => {
        const startedAt = this.deps.clock.now();
        const outcome = await consumer.stop(timeoutMs);
        return { queue: consumer.queue, ...outcome, tookMs: this.deps.clock.now() - startedAt };
      }),
    );
    await this.unlisten();
    this.state = 'stopped';
    for (const r of results) {
      if (r.finished + r.aborted + r.released === 0) continue;
      // How long stopping took, apart from the limit it had: "after 8000 ms" read as if
      // finishing four jobs had taken eight seconds.
      this.deps.logger.log(
        `queue '${r.queue}' stopped in ${Math.round(r.tookMs)} ms: ${r.finished} running job(s) finished, ${r.aborted} aborted (limit ${timeoutMs} ms), ${r.released} prefetched job(s) given back`,
      );
    }
  }

  /** Closes the LISTEN connection, bounded: a half-open socket must not hold shutdown. */
  private async unlisten(): Promise<void> {
    const stopListening = this.stopListening;
    this.stopListening = null;
    if (stopListening)
      await settleWithin(
        stopListening().catch(() => undefined),
        UNLISTEN_TIMEOUT_MS,
      );
  }

  wake(queue: string): void {
    this.queues.get(queue)?.wake();
  }

  snapshot(): ConsumerSnapshot {
    return {
      running: this.state === 'running',
      startedAt: this.startedAt,
      queues: [...this.queues.values()].map((c) => c.snapshot()),
    };
  }
}
