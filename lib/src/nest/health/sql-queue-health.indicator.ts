import { Injectable, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { assessConsumerLiveness, defaultStalledAfterMs } from '../../core/consumer/index.js';
import { SqlQueueConfigError } from '../../core/errors.js';
import type { QueueStats } from '../../core/types.js';
import { withTimeout } from '../../core/timeout.js';
import { SqlQueueConsumerHost } from '../consumer.host.js';
import type { SqlQueueRuntime } from '../sql-queue.runtime.js';
import { SQL_QUEUE_RUNTIME } from '../sql-queue.tokens.js';

/** Options of `SqlQueueHealthIndicator.database()`. */
export interface SqlQueueDatabaseCheckOptions {
  /** Longest wait for the round trip (default 2,000 ms); keep it below the probe's own timeout. */
  timeoutMs?: number;
}

/** Options of `SqlQueueHealthIndicator.consumer()`. */
export interface SqlQueueConsumerCheckOptions {
  /**
   * How long a queue's claim loop may go without progress, while a reader waits for work,
   * before the queue counts as wedged (default: 60 s, or 3 × the queue's maxPollMs if longer).
   */
  stalledAfterMs?: number;
}

/** Options of `SqlQueueHealthIndicator.broker()`. */
export interface SqlQueueBrokerCheckOptions {
  /** Longest wait for the queue's catalog reading (default 2,000 ms). */
  timeoutMs?: number;
}

/** Options of `SqlQueueHealthIndicator.backlog()`: each threshold is optional and inclusive. */
export interface SqlQueueBacklogCheckOptions {
  queue: string;
  /** Down when the oldest due job has waited longer than this. */
  maxOldestReadyAgeMs?: number;
  /** Down when more expired leases than this wait for the reaper. */
  maxExpiredLeases?: number;
  /** Down when more dead jobs than this are kept. */
  maxDead?: number;
  /** Down when more due jobs than this are waiting. */
  maxReady?: number;
  /** Longest wait for the statistics (default 2,000 ms). */
  timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 2_000;
const MAX_TIMEOUT_MS = 60_000;

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function checkTimeout(value: number | undefined): number {
  const timeoutMs = value ?? DEFAULT_TIMEOUT_MS;
  if (!Number.isInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > MAX_TIMEOUT_MS) {
    throw new SqlQueueConfigError(`timeoutMs must be an integer from 1 to ${MAX_TIMEOUT_MS}, got ${String(value)}`);
  }
  return timeoutMs;
}

/**
 * Terminus health indicators for the queue (Terminus 11+/12 style: a plain injectable that
 * returns `check(key).up(details)` or `.down(details)`). No method throws, and none waits
 * past its own time bound, whatever the database does.
 *
 * - `database(key)`, for readiness: one bounded round trip to the queue's database.
 * - `consumer(key)`, for liveness: the consumer host runs and no queue's readers are wedged.
 *   It reads the consumer's in-memory snapshot only, so a database outage does not fail it
 *   (which would restart every pod at once, and fix nothing).
 * - `broker(key, name)`, for readiness or alerting (SQL Server): a Service Broker queue receives
 *   (Service Broker's poison detection has not disabled it), its activation event notification
 *   exists, and this process's activation listener is alive.
 * - `backlog(key, { queue, … })`, for alerting or a separate endpoint, not for probes: the
 *   queue's statistics against thresholds. Restarting or unrouting a pod does not drain a
 *   backlog.
 *
 * Needs `SqlQueueModule.forRoot()`/`forRootAsync()` somewhere in the application (found
 * across modules; the boot fails with a clear message when it is missing).
 */
@Injectable()
export class SqlQueueHealthIndicator implements OnModuleInit {
  private runtime: SqlQueueRuntime | null = null;
  private host: SqlQueueConsumerHost | null = null;
  /** One round trip at a time: probes arriving while one is in flight share it. */
  private ping: Promise<void> | null = null;

  constructor(
    private readonly healthIndicatorService: HealthIndicatorService,
    private readonly moduleRef: ModuleRef,
  ) {}

  /** Finds SqlQueueModule's runtime and consumer host anywhere in the application (fails the boot if absent). */
  onModuleInit(): void {
    try {
      this.runtime = this.moduleRef.get<SqlQueueRuntime>(SQL_QUEUE_RUNTIME, { strict: false });
      this.host = this.moduleRef.get(SqlQueueConsumerHost, { strict: false });
    } catch (error) {
      throw new SqlQueueConfigError(
        'SqlQueueHealthModule needs SqlQueueModule: import SqlQueueModule.forRoot() or forRootAsync() in your application',
        { cause: error },
      );
    }
  }

  private required(): { runtime: SqlQueueRuntime; host: SqlQueueConsumerHost } {
    if (!this.runtime || !this.host) {
      throw new SqlQueueConfigError('SqlQueueHealthIndicator is used before its module initialized');
    }
    return { runtime: this.runtime, host: this.host };
  }

  /**
   * Readiness: a round trip to the queue's database within `timeoutMs` (default 2 s).
   * Up with the response time; down with the error or the timeout.
   */
  async database<const Key extends string>(
    key: Key,
    options: SqlQueueDatabaseCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key>> {
    const session = this.healthIndicatorService.check(key);
    const startedAt = Date.now();
    let where: { dialect?: string; schema?: string } = {};
    try {
      const timeoutMs = checkTimeout(options.timeoutMs);
      const { runtime } = this.required();
      where = { dialect: runtime.store.dialect, schema: runtime.store.schema };
      this.ping ??= runtime.store.ping(timeoutMs).finally(() => {
        this.ping = null;
      });
      // Bounded here as well: a store's own timeout is not trusted to fire.
      await withTimeout(this.ping, timeoutMs, 'database round trip');
      return session.up({ ...where, responseTimeMs: Date.now() - startedAt });
    } catch (error) {
      return session.down({ ...where, responseTimeMs: Date.now() - startedAt, error: messageOf(error) });
    }
  }

  /**
   * Liveness: the consumer host is running and no queue is wedged (no reader left, or the
   * claim loop stuck while readers wait for work; see `stalledAfterMs`). Never touches the
   * database. A process whose consumer is disabled (`consumer.enabled: false`) is up.
   */
  async consumer<const Key extends string>(
    key: Key,
    options: SqlQueueConsumerCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key>> {
    const session = this.healthIndicatorService.check(key);
    try {
      const { host } = this.required();
      if (!host.enabled) return session.up({ enabled: false });
      if (
        options.stalledAfterMs !== undefined &&
        (!Number.isInteger(options.stalledAfterMs) || options.stalledAfterMs < 1)
      ) {
        throw new SqlQueueConfigError(
          `stalledAfterMs must be a positive integer, got ${String(options.stalledAfterMs)}`,
        );
      }
      const verdict = assessConsumerLiveness(
        host.snapshot(),
        Date.now(),
        (queue) => options.stalledAfterMs ?? defaultStalledAfterMs(queue.maxPollMs),
      );
      const queues = Object.fromEntries(
        verdict.queues.map((q) => [
          q.queue,
          {
            readers: q.readers,
            running: q.running,
            idleReaders: q.idleReaders,
            claimFailing: q.claimFailing,
            sinceLastLoopMs: q.sinceLastLoopMs,
            stalledAfterMs: q.stalledAfterMs,
            ...(q.stopping ? { stopping: true } : {}),
            ...(q.reason ? { reason: q.reason } : {}),
          },
        ]),
      );
      const details = { running: verdict.running, queues };
      return verdict.live ? session.up(details) : session.down({ ...details, reason: verdict.reason });
    } catch (error) {
      return session.down({ error: messageOf(error) });
    }
  }

  /**
   * A Service Broker queue declared under the `broker` option: up when it is receive-enabled,
   * its activation event notification exists and (in a process that consumes it) the
   * activation listener is alive; down with the problems found, or when the reading took
   * longer than `timeoutMs` (default 2 s).
   */
  async broker<const Key extends string>(
    key: Key,
    name: string,
    options: SqlQueueBrokerCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key>> {
    const session = this.healthIndicatorService.check(key);
    try {
      const timeoutMs = checkTimeout(options.timeoutMs);
      const { runtime } = this.required();
      const broker = runtime.broker;
      if (!broker?.queue(name)) {
        throw new SqlQueueConfigError(`'${String(name)}' is not a broker queue declared under the broker option`);
      }
      const reading = await withTimeout(
        broker.health(name),
        timeoutMs,
        `reading the state of Service Broker queue '${name}'`,
      );
      const details = { queue: name, ...reading.details };
      return reading.healthy ? session.up(details) : session.down({ ...details, problems: reading.problems });
    } catch (error) {
      return session.down({ queue: name, error: messageOf(error) });
    }
  }

  /**
   * The queue's statistics against thresholds (each optional): up with the figures, down with
   * the figures and the thresholds exceeded, or down when the statistics could not be read
   * within `timeoutMs` (default 2 s).
   */
  async backlog<const Key extends string>(
    key: Key,
    options: SqlQueueBacklogCheckOptions,
  ): Promise<HealthIndicatorResult<Key>> {
    const session = this.healthIndicatorService.check(key);
    const queue = options?.queue;
    try {
      const timeoutMs = checkTimeout(options.timeoutMs);
      const { runtime } = this.required();
      // producer.stats validates the queue name before any SQL runs (and may throw at once).
      const stats = await withTimeout(
        Promise.resolve().then(() => runtime.producer.stats(queue)),
        timeoutMs,
        `reading statistics of queue '${queue}'`,
      );
      const exceeded = backlogViolations(stats, options);
      const details = {
        queue,
        ready: stats.ready,
        delayed: stats.delayed,
        leased: stats.leased,
        oldestReadyAgeMs: stats.oldestReadyAgeMs,
        expiredLeases: stats.expiredLeases,
        dead: stats.dead,
        retrying: stats.retrying,
        paused: stats.paused,
      };
      return exceeded.length === 0 ? session.up(details) : session.down({ ...details, exceeded });
    } catch (error) {
      return session.down({ queue, error: messageOf(error) });
    }
  }
}

/**
 * The thresholds a queue's statistics exceed, each as "figure value > limit". A paused queue's
 * waiting jobs wait on purpose: its ready count and oldest ready age are not held against it
 * (expired leases and dead jobs still are).
 */
export function backlogViolations(stats: QueueStats, limits: Omit<SqlQueueBacklogCheckOptions, 'queue'>): string[] {
  const checks: [string, number, number | undefined][] = [
    ['oldestReadyAgeMs', stats.oldestReadyAgeMs, limits.maxOldestReadyAgeMs],
    ['expiredLeases', stats.expiredLeases, limits.maxExpiredLeases],
    ['dead', stats.dead, limits.maxDead],
    ['ready', stats.ready, limits.maxReady],
  ];
  const waiting = new Set(['oldestReadyAgeMs', 'ready']);
  return checks
    .filter(([name]) => !(stats.paused && waiting.has(name)))
    .filter(([, value, limit]) => limit !== undefined && value > limit)
    .map(([name, value, limit]) => `${name} ${value} > ${limit}`);
}
