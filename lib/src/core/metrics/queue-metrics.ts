import { SqlQueueConfigError } from '../errors.js';
import type { QueueEventListener } from '../events.js';
import type { QueueStore } from '../queue-store.js';
import type { QueueHealth } from '../types.js';
import { resolveScalePolicy, type ResolvedScalePolicy, type ScalePolicy } from '../scaling/index.js';
import { withTimeout } from '../timeout.js';
import { assertInteger, assertOptionGroup, DAY_MS } from '../validation.js';

/**
 * Upper bounds (seconds) of the completion-latency histograms. Enqueue→done spans a
 * millisecond hand-off to hours of backlog or backoff, claim→done spans a quick handler to
 * `maxDurationMs` (one hour by default), so the buckets run from 5 ms to one hour.
 */
export const DEFAULT_LATENCY_BUCKETS_SECONDS: readonly number[] = [
  0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
];

/** `metrics` option of the module: how the queue measures itself. */
export interface MetricsOptions {
  /** Attempts that ended within this window count as recent failures (default 15 minutes). */
  failureWindowMs?: number;
  /** An unfinished job counts as repeatedly failing once it has failed this many times (default 3). */
  repeatedFailures?: number;
  /**
   * A database reading is reused for this long (default 5 s), so several scrapers, probes and
   * dashboards polling at once cost one statement.
   */
  cacheMs?: number;
  /** A database reading that takes longer is reported as failed (default 3 s); scrapes never hang. */
  timeoutMs?: number;
  /** Upper bounds, in seconds, of the completion-latency histogram buckets. */
  latencyBucketsSeconds?: number[];
  /** How the scale recommendation (`sqlqueue_desired_workers`) sizes a queue's readers. */
  scaling?: ScalePolicy;
}

export interface ResolvedMetricsOptions {
  failureWindowMs: number;
  repeatedFailures: number;
  cacheMs: number;
  timeoutMs: number;
  latencyBucketsSeconds: readonly number[];
  scaling: ResolvedScalePolicy;
}

/** Checks the `metrics` option at boot, with the option's name in every message. */
export function resolveMetricsOptions(raw: MetricsOptions | undefined): ResolvedMetricsOptions {
  const value = assertOptionGroup('metrics', raw, [
    'failureWindowMs',
    'repeatedFailures',
    'cacheMs',
    'timeoutMs',
    'latencyBucketsSeconds',
    'scaling',
  ]);
  const buckets = value.latencyBucketsSeconds ?? DEFAULT_LATENCY_BUCKETS_SECONDS;
  if (
    !Array.isArray(buckets) ||
    buckets.length === 0 ||
    buckets.some((b, i) => typeof b !== 'number' || !Number.isFinite(b) || b <= 0 || (i > 0 && b <= buckets[i - 1]!))
  ) {
    throw new SqlQueueConfigError(
      'metrics.latencyBucketsSeconds must be a non-empty array of increasing positive numbers (seconds)',
    );
  }
  return {
    failureWindowMs: assertInteger('metrics.failureWindowMs', value.failureWindowMs ?? 900_000, 1_000, 7 * DAY_MS),
    repeatedFailures: assertInteger('metrics.repeatedFailures', value.repeatedFailures ?? 3, 1, 1_000),
    cacheMs: assertInteger('metrics.cacheMs', value.cacheMs ?? 5_000, 0, 600_000),
    timeoutMs: assertInteger('metrics.timeoutMs', value.timeoutMs ?? 3_000, 10, 120_000),
    latencyBucketsSeconds: [...buckets],
    scaling: resolveScalePolicy(value.scaling, 'metrics.scaling'),
  };
}

/** Cumulative buckets, as Prometheus and OpenTelemetry expect them. */
export interface HistogramSnapshot {
  /**
   * One entry per finite upper bound `le` (seconds); `count` includes every smaller bucket.
   * The implicit last bucket (+Inf) holds `count` observations.
   */
  buckets: { le: number; count: number }[];
  /** Sum of all observations, in seconds. */
  sum: number;
  count: number;
}

/** A fixed-bucket histogram: constant memory whatever the number of jobs. */
export class LatencyHistogram {
  private readonly counts: number[];
  private sum = 0;
  private count = 0;

  /** @param bounds increasing upper bounds in seconds; a +Inf bucket is implied. */
  constructor(private readonly bounds: readonly number[]) {
    this.counts = new Array<number>(bounds.length + 1).fill(0);
  }

  /** Records one duration; negative or non-finite values (a clock step) are ignored. */
  observe(seconds: number): void {
    if (!Number.isFinite(seconds) || seconds < 0) return;
    let i = 0;
    while (i < this.bounds.length && seconds > this.bounds[i]!) i++;
    this.counts[i]!++;
    this.sum += seconds;
    this.count++;
  }

  /** The buckets so far, cumulative. */
  snapshot(): HistogramSnapshot {
    let running = 0;
    // JSON-safe: the +Inf bucket is `count`, not an entry with an infinite bound.
    const buckets = this.bounds.map((le, i) => {
      running += this.counts[i]!;
      return { le, count: running };
    });
    return { buckets, sum: this.sum, count: this.count };
  }
}

/** What this process saw of one queue since it started, from the engine's events. */
export interface QueueEventFigures {
  queue: string;
  /** Claim statements that returned jobs, and the jobs they returned. */
  claims: number;
  claimedJobs: number;
  /** Claim statements that came back empty (each one starts an idle pause). */
  emptyClaims: number;
  completed: number;
  /** Failed attempts that will be retried. */
  retried: number;
  /** Failed attempts that moved their job to dead. */
  deadLettered: number;
  /** Writes refused because the job's claim token had changed: this worker had lost the job. */
  lostOwnership: { heartbeat: number; complete: number; fail: number; release: number };
  /** Handlers that ignored their abort signal; the reader moved on and the lease decides. */
  abandoned: number;
  /** Jobs this process held that cancel() ended (their handlers were aborted). */
  canceled: number;
  /** Jobs postponed by their handlers (SqlQueueRateLimitedError, `context.rateLimited()`). */
  rateLimited: number;
  /** Ordered groups this process's repair sweep found inconsistent and fixed (should stay 0). */
  groupRepairs: number;
  /** Readers started by the activation rule (work waiting, readers busy), and readers retired. */
  readerActivations: number;
  readerRetirements: number;
  /** Reader count after the last change; null until the queue's readers start. */
  readers: number | null;
  /** Enqueue → done (database creation time to the completion being recorded). */
  enqueueToDone: HistogramSnapshot;
  /** Claim → done (the handler's run plus recording the completion). */
  claimToDone: HistogramSnapshot;
}

interface MutableFigures extends Omit<QueueEventFigures, 'enqueueToDone' | 'claimToDone'> {
  enqueueToDone: LatencyHistogram;
  claimToDone: LatencyHistogram;
}

/**
 * Counts the engine's events per queue. Framework-free and cheap (a few increments per job),
 * so it is always on; exporters read `snapshot()` or listen to the same events themselves.
 */
export class QueueEventMetrics implements QueueEventListener {
  private readonly queues = new Map<string, MutableFigures>();

  constructor(private readonly bucketsSeconds: readonly number[] = DEFAULT_LATENCY_BUCKETS_SECONDS) {}

  private of(queue: string): MutableFigures {
    let figures = this.queues.get(queue);
    if (!figures) {
      figures = this.empty(queue);
      this.queues.set(queue, figures);
    }
    return figures;
  }

  private empty(queue: string): MutableFigures {
    return {
      queue,
      claims: 0,
      claimedJobs: 0,
      emptyClaims: 0,
      completed: 0,
      retried: 0,
      deadLettered: 0,
      lostOwnership: { heartbeat: 0, complete: 0, fail: 0, release: 0 },
      abandoned: 0,
      canceled: 0,
      rateLimited: 0,
      groupRepairs: 0,
      readerActivations: 0,
      readerRetirements: 0,
      readers: null,
      enqueueToDone: new LatencyHistogram(this.bucketsSeconds),
      claimToDone: new LatencyHistogram(this.bucketsSeconds),
    };
  }

  claimed(event: { queue: string; count: number }): void {
    const figures = this.of(event.queue);
    figures.claims++;
    figures.claimedJobs += event.count;
  }

  emptyClaim(event: { queue: string }): void {
    this.of(event.queue).emptyClaims++;
  }

  completed(event: { queue: string; enqueueToDoneMs: number; claimToDoneMs: number }): void {
    const figures = this.of(event.queue);
    figures.completed++;
    figures.enqueueToDone.observe(event.enqueueToDoneMs / 1000);
    figures.claimToDone.observe(event.claimToDoneMs / 1000);
  }

  failed(event: { queue: string; dead: boolean }): void {
    const figures = this.of(event.queue);
    if (event.dead) figures.deadLettered++;
    else figures.retried++;
  }

  lostOwnership(event: { queue: string; during: 'heartbeat' | 'complete' | 'fail' | 'release' }): void {
    this.of(event.queue).lostOwnership[event.during]++;
  }

  abandoned(event: { queue: string }): void {
    this.of(event.queue).abandoned++;
  }

  canceled(event: { queue: string }): void {
    this.of(event.queue).canceled++;
  }

  rateLimited(event: { queue: string }): void {
    this.of(event.queue).rateLimited++;
  }

  groupRepaired(event: { queue: string }): void {
    this.of(event.queue).groupRepairs++;
  }

  readersChanged(event: { queue: string; readers: number; reason: 'start' | 'activation' | 'retire' | 'stop' }): void {
    const figures = this.of(event.queue);
    figures.readers = event.readers;
    if (event.reason === 'activation') figures.readerActivations++;
    else if (event.reason === 'retire') figures.readerRetirements++;
  }

  /** Queues that produced at least one event in this process. */
  queueNames(): string[] {
    return [...this.queues.keys()];
  }

  /** Figures of one queue; zeros for a queue that has not produced an event yet. */
  figures(queue: string): QueueEventFigures {
    const figures = this.queues.get(queue) ?? this.empty(queue);
    return {
      ...figures,
      lostOwnership: { ...figures.lostOwnership },
      enqueueToDone: figures.enqueueToDone.snapshot(),
      claimToDone: figures.claimToDone.snapshot(),
    };
  }

  /** Figures of every queue that produced an event. */
  snapshot(): QueueEventFigures[] {
    return this.queueNames().map((queue) => this.figures(queue));
  }
}

/** A queue with nothing in the database: every figure zero. */
export function emptyQueueHealth(queue: string): QueueHealth {
  return {
    queue,
    ready: 0,
    delayed: 0,
    leased: 0,
    expiredLeases: 0,
    dead: 0,
    retrying: 0,
    blockedGroups: 0,
    oldestReadyAgeMs: 0,
    paused: false,
    recentFailures: 0,
    recentLeaseExpiries: 0,
    repeatedlyFailing: 0,
  };
}

/** One reading of every queue's database figures. */
export interface QueueHealthReading {
  /** False when the database could not be read in time; `queues` is empty then. */
  ok: boolean;
  /** Epoch milliseconds when the reading finished; null when it failed. */
  readAt: number | null;
  /** How long the statement took (or how long was waited before giving up). */
  durationMs: number;
  /** Why the reading failed; null when it succeeded. */
  error: string | null;
  queues: QueueHealth[];
}

/**
 * Reads `QueueStore.queueHealth` for scrapers: at most one statement in flight (concurrent
 * callers share it), a result reused for `cacheMs`, and a bound of `timeoutMs` on how long a
 * caller waits. It never throws: a failure is a reading with `ok: false`, so an exporter can
 * report "could not read" instead of failing the whole scrape.
 */
export class QueueHealthReader {
  private inFlight: Promise<QueueHealthReading> | null = null;
  private inFlightSince = 0;
  private last: QueueHealthReading | null = null;

  constructor(
    private readonly store: Pick<QueueStore, 'queueHealth'>,
    private readonly options: ResolvedMetricsOptions,
    private readonly now: () => number = Date.now,
  ) {}

  /** The latest reading if younger than `maxAgeMs` (default `cacheMs`), else a fresh one. */
  async read(maxAgeMs = this.options.cacheMs): Promise<QueueHealthReading> {
    const last = this.last;
    if (last?.ok && last.readAt !== null && this.now() - last.readAt < maxAgeMs) return last;
    const startedAt = this.now();
    // A statement still running from an earlier, timed-out call is joined rather than repeated:
    // a slow database must not be handed one more statement per scrape. But one stuck for long
    // (a half-open connection) is abandoned, or the reader would stay failed after recovery.
    if (this.inFlight && startedAt - this.inFlightSince > 2 * this.options.timeoutMs) this.inFlight = null;
    if (!this.inFlight) {
      this.inFlightSince = startedAt;
      const query = this.query();
      this.inFlight = query;
      const settled = () => {
        if (this.inFlight === query) this.inFlight = null;
      };
      query.then(settled, settled);
    }
    try {
      return await withTimeout(this.inFlight, this.options.timeoutMs, 'reading queue figures');
    } catch (error) {
      return {
        ok: false,
        readAt: null,
        durationMs: this.now() - startedAt,
        error: error instanceof Error ? error.message : String(error),
        queues: [],
      };
    }
  }

  /** One statement; a failure rejects, and read() turns it into a failed reading. */
  private async query(): Promise<QueueHealthReading> {
    const startedAt = this.now();
    const queues = await this.store.queueHealth({
      failureWindowMs: this.options.failureWindowMs,
      repeatedFailures: this.options.repeatedFailures,
    });
    this.last = { ok: true, readAt: this.now(), durationMs: this.now() - startedAt, error: null, queues };
    return this.last;
  }
}

/**
 * This process's Service Broker events of one broker queue, counted since it started (its
 * handlers' outcomes are the table queue's figures).
 */
export interface BrokerEventFigures {
  queue: string;
  /** Messages its receivers took from the Service Broker queue. */
  received: number;
  /** Of those, messages now jobs of its table queue (the rest: EndDialog, Error, DialogTimer). */
  moved: number;
  /** Conversations ended by EndDialog or Error messages received. */
  ended: number;
  /** Receivers started by a QUEUE_ACTIVATION notification, or by the slow poll. */
  activations: { notification: number; poll: number };
  /** Times the queue's event notification was found missing or broken. */
  notificationLost: number;
}

/** Counts the broker events of QueueEventListener per broker queue. */
export class BrokerEventCounts implements QueueEventListener {
  private readonly byQueue = new Map<string, BrokerEventFigures>();

  figures(queue: string): BrokerEventFigures {
    let figures = this.byQueue.get(queue);
    if (!figures) {
      figures = {
        queue,
        received: 0,
        moved: 0,
        ended: 0,
        activations: { notification: 0, poll: 0 },
        notificationLost: 0,
      };
      this.byQueue.set(queue, figures);
    }
    return figures;
  }

  brokerMoved(event: { queue: string; received: number; moved: number; ended: number }): void {
    const figures = this.figures(event.queue);
    figures.received += event.received;
    figures.moved += event.moved;
    figures.ended += event.ended;
  }

  brokerActivated(event: { queue: string; source: 'notification' | 'poll' }): void {
    this.figures(event.queue).activations[event.source]++;
  }

  brokerNotificationLost(event: { queue: string }): void {
    this.figures(event.queue).notificationLost++;
  }
}

/**
 * One reading shared by every caller for `maxAgeMs` (scrapers, health endpoints), so several
 * scrapes cost one round trip. A failed reading (`ok: false`) is not reused: the next call
 * reads again. `read` must not throw (it reports failure in its result).
 */
export class SharedReading<T extends { ok: boolean }> {
  private last: { at: number; reading: Promise<T> } | null = null;

  constructor(
    private readonly read: (startedAt: number) => Promise<T>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  get(): Promise<T> {
    const now = this.now();
    if (!this.last || now - this.last.at >= this.maxAgeMs) {
      const reading = this.read(now);
      const last = { at: now, reading };
      this.last = last;
      void reading.then((r) => {
        if (!r.ok && this.last === last) this.last = null;
      });
    }
    return this.last.reading;
  }
}
