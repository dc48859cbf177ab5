import { Inject, Injectable } from '@nestjs/common';
import type { QueueEventListener } from '../core/events.js';
import type { BrokerQueueStats } from '../broker/broker.types.js';
import { withTimeout } from '../core/timeout.js';
import {
  BrokerEventCounts,
  SharedReading,
  type BrokerEventFigures,
  emptyQueueHealth,
  QueueEventMetrics,
  QueueHealthReader,
  type QueueEventFigures,
  type QueueHealthReading,
  type ResolvedMetricsOptions,
} from '../core/metrics/index.js';
import type { QueueHealth } from '../core/types.js';
import { assertQueueName } from '../core/validation.js';
import { resolveQueueOptions } from '../core/options.js';
import { desiredReaders, desiredWorkers, ScaleRecommender, type ScaleInputs } from '../core/scaling/index.js';
import { SqlQueueConsumerHost } from './consumer.host.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';
import type { SqlQueueRuntime } from './sql-queue.runtime.js';

/** This process's readers of one queue, at this instant. */
export interface SqlQueueReaderState {
  readers: number;
  /** Handlers running now. */
  running: number;
  /** Jobs claimed ahead (prefetch) and not started yet. */
  buffered: number;
  /** Claims are failing right now (database unreachable, …). */
  claimFailing: boolean;
  stopping: boolean;
  /** Milliseconds since the claim loop last made progress. */
  sinceLastLoopMs: number;
}

/** What this process measured of one queue: event counts, latency histograms and its readers. */
export interface SqlQueueProcessFigures extends QueueEventFigures {
  /** Null where this process does not consume the queue (or its consumer has not started). */
  consumer: SqlQueueReaderState | null;
}

/** Everything SqlQueueMetrics knows, in one object (for a JSON endpoint or a custom exporter). */
export interface SqlQueueMetricsSnapshot {
  /** Database figures of every queue (all workers), read through the cache. */
  database: QueueHealthReading;
  /** Figures of this process, per queue. */
  process: SqlQueueProcessFigures[];
  /** The failure window and repeated-failure threshold the database figures were read with. */
  failureWindowMs: number;
  repeatedFailures: number;
}

/** Scale inputs read at once by one scrape (one statement per queue). */
const SCALE_READ_CONCURRENCY = 2;

/** `work` over `items`, at most `limit` at a time, results in input order. */
async function mapWithConcurrency<T, R>(
  items: readonly T[],
  limit: number,
  work: (item: T) => Promise<R>,
): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  const lane = async () => {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  return results;
}

/** The scale recommendation of one queue (core/scaling), as the Prometheus gauges give it. */
export interface SqlQueueScaleFigures {
  queue: string;
  /**
   * What the database says now (every worker). For a Service Broker queue, `claimable` includes
   * the messages waiting in its broker queue, which its receivers move into this table queue.
   */
  inputs: ScaleInputs;
  /** Messages waiting in the Service Broker queue of this name; null for a table queue only. */
  brokerMessagesWaiting: number | null;
  /** Readers the queue needs now, across every pod (what the SQL function for KEDA returns). */
  desiredReaders: number;
  /**
   * desiredReaders as followed over time in this process: up at once, down only once the lower
   * value has held for `metrics.scaling.scaleDownDelayMs` (as an HPA's scale-down stabilization).
   */
  recommendedReaders: number;
  /** The queue's maxReaders in this process's configuration: what one pod runs. */
  maxReaders: number;
  /** Pods for recommendedReaders at maxReaders each (`sqlqueue_desired_workers`). */
  desiredWorkers: number;
}

/** One reading of every known queue's scale recommendation. */
export interface SqlQueueScaleReading {
  ok: boolean;
  readAt: number | null;
  durationMs: number;
  error: string | null;
  queues: SqlQueueScaleFigures[];
}

/** The figures of one queue, for an endpoint such as `GET /queues/:name/stats`. */
export interface SqlQueueQueueMetrics {
  queue: string;
  /** Database figures (all workers); null when the database could not be read in time. */
  database: QueueHealth | null;
  databaseError: string | null;
  process: SqlQueueProcessFigures;
}

/**
 * The queue's measurements, per queue. Two sources, kept apart because they mean different
 * things:
 * - database figures (ready, delayed, leased, expired leases, dead, oldest ready age, recent
 *   failures, repeatedly failing jobs) describe the queue as every worker sees it; they are
 *   read in one statement for all queues, cached for `metrics.cacheMs` and bounded by
 *   `metrics.timeoutMs`, so any number of scrapers cost one cheap statement;
 * - process figures (completions, failures, lost ownership, reader activations, latency
 *   histograms, reader counts) are what this process saw since it started, from the engine's
 *   events and the consumer's snapshot; they cost no database round trip.
 *
 * Provided and exported by SqlQueueModule. The Prometheus exporter
 * (`nestjs-sql-queue/prometheus`) and the Terminus indicators (`nestjs-sql-queue/health`)
 * build on it; applications can read it directly.
 */
@Injectable()
export class SqlQueueMetrics {
  private readonly events: QueueEventMetrics;
  private readonly reader: QueueHealthReader;
  private readonly brokerEvents = new BrokerEventCounts();
  private readonly brokerReading: SharedReading<SqlQueueBrokerReading>;
  private readonly scheduleReading: SharedReading<SqlQueueScheduleReading>;
  /** Ticks fired and skipped by this process's scheduler, by schedule id. */
  private readonly scheduleTicks = new Map<string, SqlQueueScheduleTicks>();
  private readonly scaleReading: SharedReading<SqlQueueScaleReading>;
  private readonly recommenders = new Map<string, ScaleRecommender>();

  constructor(
    @Inject(SQL_QUEUE_RUNTIME) private readonly runtime: SqlQueueRuntime,
    private readonly host: SqlQueueConsumerHost,
  ) {
    this.events = new QueueEventMetrics(runtime.options.metrics.latencyBucketsSeconds);
    this.reader = new QueueHealthReader(runtime.store, runtime.options.metrics);
    // Registered at construction, before the consumer starts on bootstrap: no event is missed.
    runtime.addListener(this.events);
    this.brokerReading = new SharedReading((startedAt) => this.queryBroker(startedAt), runtime.options.metrics.cacheMs);
    this.scheduleReading = new SharedReading(
      (startedAt) => this.querySchedules(startedAt),
      runtime.options.metrics.cacheMs,
    );
    this.scaleReading = new SharedReading((startedAt) => this.queryScale(startedAt), runtime.options.metrics.cacheMs);
    if (runtime.options.broker) runtime.addListener(this.brokerEvents);
    runtime.addListener({
      scheduleFired: (event) => {
        const ticks = this.scheduleTicks.get(event.id) ?? { id: event.id, queue: event.queue, fired: 0, skipped: 0 };
        ticks.queue = event.queue;
        ticks.fired += event.ticks;
        ticks.skipped += event.skipped;
        this.scheduleTicks.set(event.id, ticks);
      },
    });
  }

  /** The resolved `metrics` module options. */
  get options(): ResolvedMetricsOptions {
    return this.runtime.options.metrics;
  }

  /**
   * Receives every engine event from now on (claims, completions with their latencies,
   * failures, lost ownership, reader changes), for exporters that keep their own instruments.
   */
  addListener(listener: QueueEventListener): void {
    this.runtime.addListener(listener);
  }

  /**
   * Queues worth reporting even when they have nothing in the database: configured in the
   * module, consumed here, or seen in this process's events. Reporting them as zeros keeps
   * their series continuous instead of vanishing when a queue drains.
   */
  knownQueues(): string[] {
    const names = new Set<string>(Object.keys(this.runtime.options.queues));
    for (const q of this.host.snapshot().queues) names.add(q.queue);
    for (const name of this.events.queueNames()) names.add(name);
    return [...names].sort();
  }

  /**
   * Database figures of every queue (those with live jobs or recent failures, plus the known
   * queues and `alsoQueues` as zeros). Reuses a reading younger than `maxAgeMs` (default `metrics.cacheMs`),
   * never waits longer than `metrics.timeoutMs`, never throws: a failed reading has
   * `ok: false` and the reason.
   */
  async readDatabase(options: { maxAgeMs?: number; alsoQueues?: Iterable<string> } = {}): Promise<QueueHealthReading> {
    const reading = await this.reader.read(options.maxAgeMs);
    if (!reading.ok) return reading;
    const present = new Set(reading.queues.map((q) => q.queue));
    const known = new Set([...this.knownQueues(), ...(options.alsoQueues ?? [])]);
    const missing = [...known].filter((queue) => !present.has(queue));
    if (missing.length === 0) return reading;
    const queues = [...reading.queues, ...missing.map(emptyQueueHealth)].sort((a, b) =>
      a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0,
    );
    return { ...reading, queues };
  }

  /** What this process measured, for every known queue. No database round trip. */
  processFigures(): SqlQueueProcessFigures[] {
    const now = Date.now();
    const consumers = new Map(this.host.snapshot().queues.map((q) => [q.queue, q]));
    return this.knownQueues().map((queue) => {
      const consumer = consumers.get(queue);
      return {
        ...this.events.figures(queue),
        consumer: consumer
          ? {
              readers: consumer.readers,
              running: consumer.running,
              buffered: consumer.buffered,
              claimFailing: consumer.claimFailing,
              stopping: consumer.stopping,
              sinceLastLoopMs: Math.max(0, now - consumer.lastLoopAt),
            }
          : null,
      };
    });
  }

  /** Database and process figures of one queue (the queue name is validated first). */
  async queue(name: string): Promise<SqlQueueQueueMetrics> {
    const queue = assertQueueName(name);
    const reading = await this.readDatabase();
    const database = reading.ok ? (reading.queues.find((q) => q.queue === queue) ?? emptyQueueHealth(queue)) : null;
    const process = this.processFigures().find((p) => p.queue === queue) ?? {
      ...this.events.figures(queue),
      consumer: null,
    };
    return { queue, database, databaseError: reading.error, process };
  }

  /** Everything at once: database figures through the cache, and this process's figures. */
  async snapshot(): Promise<SqlQueueMetricsSnapshot> {
    const database = await this.readDatabase();
    return {
      database,
      process: this.processFigures(),
      failureWindowMs: this.options.failureWindowMs,
      repeatedFailures: this.options.repeatedFailures,
    };
  }

  /**
   * The scale recommendation of every queue with work in the database or known here (a queue
   * with a backlog and no consumer recommends at least 1; an idle one 0). One statement per queue,
   * the reading reused for `metrics.cacheMs` and bounded by `metrics.timeoutMs`; never throws (a
   * failed reading has `ok: false` and the reason).
   */
  readScale(): Promise<SqlQueueScaleReading> {
    return this.scaleReading.get();
  }

  private async queryScale(startedAt: number): Promise<SqlQueueScaleReading> {
    const failed = (error: unknown): SqlQueueScaleReading => ({
      ok: false,
      readAt: null,
      durationMs: Date.now() - startedAt,
      error: error instanceof Error ? error.message : String(error),
      queues: [],
    });
    const store = this.runtime.store;
    if (!store.scaleInputs) return failed(new Error('this store cannot read scale inputs'));
    const database = await this.readDatabase();
    if (!database.ok) return failed(new Error(database.error ?? 'the database could not be read'));
    const maxReadersHere = new Map(this.host.snapshot().queues.map((q) => [q.queue, q.maxReaders]));
    // Service Broker queues: their messages waiting are work of the table queue they move into.
    const waiting = new Map<string, number>();
    if (this.runtime.broker) {
      const broker = await this.readBroker();
      if (!broker?.ok) return failed(new Error(broker?.error ?? 'the Service Broker figures could not be read'));
      for (const q of broker.queues) waiting.set(q.queue, q.database?.messagesWaiting ?? 0);
    }
    const names = [...new Set([...database.queues.map((q) => q.queue), ...waiting.keys()])].sort();
    try {
      // Two statements at a time at most, so a scrape of many queues never takes the connections
      // claims and completions need.
      const queues = await withTimeout(
        mapWithConcurrency(names, SCALE_READ_CONCURRENCY, async (queue) => {
          const read = await store.scaleInputs!(queue);
          const messages = waiting.get(queue) ?? null;
          const inputs = messages === null ? read : { ...read, claimable: read.claimable + messages };
          const readers = desiredReaders(inputs, this.options.scaling);
          let recommender = this.recommenders.get(queue);
          if (!recommender) {
            recommender = new ScaleRecommender(this.options.scaling.scaleDownDelayMs);
            this.recommenders.set(queue, recommender);
          }
          const recommended = recommender.observe(Date.now(), readers);
          const maxReaders = maxReadersHere.get(queue) ?? this.configuredMaxReaders(queue);
          return {
            queue,
            inputs,
            brokerMessagesWaiting: messages,
            desiredReaders: readers,
            recommendedReaders: recommended,
            maxReaders,
            desiredWorkers: desiredWorkers(recommended, maxReaders),
          };
        }),
        this.options.timeoutMs,
        'reading scale inputs',
      );
      return { ok: true, readAt: Date.now(), durationMs: Date.now() - startedAt, error: null, queues };
    } catch (error) {
      return failed(error);
    }
  }

  /** maxReaders of a queue this process does not consume, from its module options (checked at boot). */
  private configuredMaxReaders(queue: string): number {
    return resolveQueueOptions(queue, { module: this.runtime.options.queues[queue] }, this.runtime.options.consumer)
      .maxReaders;
  }

  /** Whether the module declares Service Broker queues (the `broker` option). */
  get hasBroker(): boolean {
    return this.runtime.broker !== null;
  }

  /**
   * Service Broker queues (the `broker` option; null without it): messages waiting (not moved
   * yet) and dead jobs from the database, conversation endpoints by state, and this process's
   * receivers and event counts. Reuses a reading younger than `metrics.cacheMs`, never waits longer than
   * `metrics.timeoutMs`, never throws: a failed database reading has `ok: false`, the process
   * figures are there either way.
   */
  async readBroker(): Promise<SqlQueueBrokerReading | null> {
    return this.runtime.broker ? this.brokerReading.get() : null;
  }

  private async queryBroker(startedAt: number): Promise<SqlQueueBrokerReading> {
    const broker = this.runtime.broker!;
    const snapshot = broker.snapshot();
    const process = (name: string) => {
      const local = snapshot.queues.find((q) => q.queue === name);
      return {
        ...this.brokerEvents.figures(name),
        receivers: local?.receivers ?? 0,
        busyReceivers: local?.busyReceivers ?? 0,
      };
    };
    const names = broker.options.queues.map((q) => q.name);
    try {
      const [stats, endpoints] = await withTimeout(
        Promise.all([Promise.all(names.map((name) => broker.stats(name))), broker.conversationEndpoints()]),
        this.options.timeoutMs,
        'reading Service Broker figures',
      );
      return {
        ok: true,
        error: null,
        durationMs: Date.now() - startedAt,
        endpoints,
        queues: names.map((name, i) => ({ ...process(name), database: stats[i]! })),
      };
    } catch (error) {
      return {
        ok: false,
        error: error instanceof Error ? error.message : String(error),
        durationMs: Date.now() - startedAt,
        endpoints: {},
        queues: names.map((name) => ({ ...process(name), database: null })),
      };
    }
  }

  /**
   * Ticks this process's scheduler fired and skipped, per schedule, since it started. No
   * database round trip: counters stay continuous when a reading fails or a schedule is deleted.
   */
  scheduleTickCounts(): SqlQueueScheduleTicks[] {
    return [...this.scheduleTicks.values()].map((ticks) => ({ ...ticks }));
  }

  /**
   * Recurring jobs: every schedule with its next and last fire time and how late it is (from
   * the database, on its clock), and the ticks this process fired and skipped. Reuses a reading
   * younger than `metrics.cacheMs`, never waits longer than `metrics.timeoutMs`, never throws.
   */
  readSchedules(): Promise<SqlQueueScheduleReading> {
    return this.scheduleReading.get();
  }

  private async querySchedules(startedAt: number): Promise<SqlQueueScheduleReading> {
    const store = this.runtime.store;
    try {
      const [rows, { now }] = await withTimeout(
        Promise.all([store.listSchedules(), store.scheduleDueIn()]),
        this.options.timeoutMs,
        'reading schedules',
      );
      return {
        ok: true,
        error: null,
        durationMs: Date.now() - startedAt,
        schedules: rows.map((row) => ({
          id: row.id,
          queue: row.queue,
          paused: row.paused,
          nextRunAt: row.nextRunAt,
          lastRunAt: row.lastRunAt,
          lagMs: !row.paused && row.nextRunAt !== null ? Math.max(0, now.getTime() - row.nextRunAt.getTime()) : 0,
          fired: this.scheduleTicks.get(row.id)?.fired ?? 0,
          skipped: this.scheduleTicks.get(row.id)?.skipped ?? 0,
        })),
      };
    } catch (error) {
      return {
        ok: false,
        error: error instanceof Error ? error.message : String(error),
        durationMs: Date.now() - startedAt,
        schedules: [],
      };
    }
  }
}

/** One reading of the Service Broker queues: see SqlQueueMetrics.readBroker(). */
export interface SqlQueueBrokerReading {
  /** False when the database figures could not be read in time (process figures are still there). */
  ok: boolean;
  error: string | null;
  durationMs: number;
  /** Conversation endpoints of the database by state (CONVERSING, DISCONNECTED_INBOUND, CLOSED, …). */
  endpoints: Record<string, number>;
  queues: (BrokerEventFigures & { receivers: number; busyReceivers: number; database: BrokerQueueStats | null })[];
}

/** One reading of the recurring jobs: see SqlQueueMetrics.readSchedules(). */
export interface SqlQueueScheduleReading {
  ok: boolean;
  error: string | null;
  durationMs: number;
  schedules: {
    id: string;
    queue: string;
    paused: boolean;
    nextRunAt: Date | null;
    lastRunAt: Date | null;
    /** How long its next tick is overdue (0 when not due, or paused): a lag that grows means no instance fires it. */
    lagMs: number;
    /** Ticks this process fired, and missed ticks it skipped (catchUp). */
    fired: number;
    skipped: number;
  }[];
}

/** Ticks one schedule's firings handled in this process (see SqlQueueMetrics.scheduleTickCounts()). */
export interface SqlQueueScheduleTicks {
  id: string;
  queue: string;
  fired: number;
  skipped: number;
}
