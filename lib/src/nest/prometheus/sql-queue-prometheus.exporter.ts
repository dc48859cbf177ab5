import { Inject, Injectable, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { SqlQueueConfigError } from '../../core/errors.js';
import type { QueueHealthReading } from '../../core/metrics/index.js';
import {
  SqlQueueMetrics,
  type SqlQueueBrokerReading,
  type SqlQueueProcessFigures,
  type SqlQueueScheduleReading,
} from '../sql-queue.metrics.js';
import { SQL_QUEUE_PROMETHEUS_OPTIONS, type SqlQueuePrometheusOptions } from './sql-queue-prometheus.options.js';

const NAME_PREFIX = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

/**
 * Exposes SqlQueueMetrics in the Prometheus text format through prom-client (an optional
 * peer, loaded only by this entry point).
 *
 * - Database gauges (`sqlqueue_jobs{queue,state}`, `sqlqueue_oldest_ready_age_seconds`, …)
 *   are collected at scrape time from one cached, time-bounded statement for all queues;
 *   when it fails, they are left out of that scrape and `sqlqueue_stats_up` is 0, rather
 *   than repeating stale values or failing the whole scrape.
 * - Counters and histograms (completions, failures, lost ownership, latencies, reader
 *   activations) count this process's engine events since it started: aggregate them across
 *   pods with `sum by (queue)` / `rate()`.
 *
 * Metrics are registered on `options.registry` (default: a registry of the exporter's own,
 * `exporter.registry`) and removed from it when the application closes.
 */
@Injectable()
export class SqlQueuePrometheusExporter implements OnModuleInit, OnApplicationShutdown {
  /** The registry holding the queue's metrics; merge it with yours or serve `metrics()`. */
  readonly registry: Registry;
  private readonly prefix: string;
  private readonly names: string[] = [];
  private closed = false;

  constructor(
    @Inject(SQL_QUEUE_PROMETHEUS_OPTIONS) options: SqlQueuePrometheusOptions,
    private readonly moduleRef: ModuleRef,
  ) {
    const prefix = options?.prefix ?? 'sqlqueue_';
    if (typeof prefix !== 'string' || !NAME_PREFIX.test(prefix)) {
      throw new SqlQueueConfigError(
        `SqlQueuePrometheusModule: prefix must be a valid Prometheus metric name start ([a-zA-Z_:][a-zA-Z0-9_:]*), got ${JSON.stringify(prefix)}`,
      );
    }
    this.prefix = prefix;
    this.registry = options?.registry ?? new Registry();
  }

  /** Content-Type to send with `metrics()`. */
  get contentType(): string {
    return this.registry.contentType;
  }

  /** The registry's metrics in the text exposition format (database gauges read now, bounded). */
  metrics(): Promise<string> {
    return this.registry.metrics();
  }

  /** Registers the metrics and starts listening to engine events, before the consumer starts. */
  onModuleInit(): void {
    let metrics: SqlQueueMetrics;
    try {
      metrics = this.moduleRef.get(SqlQueueMetrics, { strict: false });
    } catch (error) {
      throw new SqlQueueConfigError(
        'SqlQueuePrometheusModule needs SqlQueueModule: import SqlQueueModule.forRoot() or forRootAsync() in your application',
        { cause: error },
      );
    }
    this.registerDatabaseGauges(metrics);
    this.registerProcessMetrics(metrics);
    if (metrics.hasBroker) this.registerBrokerMetrics(metrics);
    this.registerScheduleMetrics(metrics);
    this.registerScaleMetrics(metrics);
  }

  /**
   * The scale recommendation (core/scaling) per queue, for the Prometheus scaler of KEDA or an HPA
   * through an adapter: readers across every pod, and pods at the queue's maxReaders. From one
   * cached, bounded reading (one statement per queue).
   */
  private registerScaleMetrics(metrics: SqlQueueMetrics): void {
    const read = () => metrics.readScale();
    this.readingGauge(
      read,
      'scale_up',
      'Whether the last scrape could read the scale recommendation from the database in time (1) or not (0).',
      [],
      (g, reading) => g.set(reading.ok ? 1 : 0),
    );
    this.readingGauge(
      read,
      'desired_readers',
      "Readers the queue needs across every pod: running jobs plus what drains the claimable backlog in metrics.scaling.targetDrainMs, lowered only after metrics.scaling.scaleDownDelayMs (every worker's figures; the same rule as the database's desired_readers / DesiredReaders).",
      ['queue'],
      (g, reading) => {
        for (const q of reading.queues) g.set({ queue: q.queue }, q.recommendedReaders);
      },
    );
    this.readingGauge(
      read,
      'desired_workers',
      'Worker pods the queue needs: sqlqueue_desired_readers over the queue’s maxReaders, rounded up; 0 for an idle or paused queue, at least 1 while work is claimable.',
      ['queue'],
      (g, reading) => {
        for (const q of reading.queues) g.set({ queue: q.queue }, q.desiredWorkers);
      },
    );
  }

  /** Recurring jobs: from one cached, bounded reading of the schedules, and this process's tick counts. */
  private registerScheduleMetrics(metrics: SqlQueueMetrics): void {
    const read = () => metrics.readSchedules();
    const gauge = (
      suffix: string,
      help: string,
      value: (s: SqlQueueScheduleReading['schedules'][number]) => number | null,
    ) =>
      this.readingGauge(read, suffix, help, ['schedule', 'queue'], (g, reading) => {
        for (const s of reading.schedules) {
          const v = value(s);
          if (v !== null) g.set({ schedule: s.id, queue: s.queue }, v);
        }
      });
    this.readingGauge(
      read,
      'schedules_up',
      'Whether the last scrape could read the recurring schedules from the database in time (1) or not (0).',
      [],
      (g, reading) => g.set(reading.ok ? 1 : 0),
    );
    gauge(
      'schedule_next_fire_timestamp_seconds',
      'When the schedule fires next (Unix time); absent when paused or it has no later tick.',
      (s) => (s.paused || s.nextRunAt === null ? null : s.nextRunAt.getTime() / 1000),
    );
    gauge(
      'schedule_last_fire_timestamp_seconds',
      'When the schedule last fired a job (Unix time); absent before the first.',
      (s) => (s.lastRunAt === null ? null : s.lastRunAt.getTime() / 1000),
    );
    gauge(
      'schedule_lag_seconds',
      "How long the schedule's next tick is overdue (0 when not due or paused). A lag that keeps growing means no instance fires it (every scheduler disabled or down).",
      (s) => s.lagMs / 1000,
    );
    gauge('schedule_paused', 'Whether the schedule is paused (1) or not (0).', (s) => (s.paused ? 1 : 0));
    new Counter({
      name: this.name('schedule_ticks_total'),
      help: "Ticks this process's scheduler handled: result fired (a job enqueued) or skipped (missed ticks catchUp did not run).",
      labelNames: ['schedule', 'queue', 'result'],
      registers: [this.registry],
      // This process's counts, not the database reading: a failed reading or a deleted schedule
      // must not make a counter vanish.
      collect() {
        this.reset();
        for (const s of metrics.scheduleTickCounts()) {
          this.inc({ schedule: s.id, queue: s.queue, result: 'fired' }, s.fired);
          this.inc({ schedule: s.id, queue: s.queue, result: 'skipped' }, s.skipped);
        }
      },
    });
  }

  /** Service Broker queues: database gauges from one cached, bounded reading, and this process's counts. */
  private registerBrokerMetrics(metrics: SqlQueueMetrics): void {
    const read = async (): Promise<SqlQueueBrokerReading> => (await metrics.readBroker())!;
    const gauge = (
      suffix: string,
      help: string,
      labelNames: string[],
      fill: (g: Gauge<string>, r: SqlQueueBrokerReading) => void,
    ) => this.readingGauge(read, suffix, help, labelNames, fill);
    const counter = (
      suffix: string,
      help: string,
      labelNames: string[],
      fill: (c: Counter<string>, r: SqlQueueBrokerReading) => void,
    ) => this.readingCounter(read, suffix, help, labelNames, fill);
    gauge(
      'broker_up',
      'Whether the last scrape could read the Service Broker figures from the database in time (1) or not (0).',
      [],
      (g, r) => g.set(r.ok ? 1 : 0),
    );
    gauge(
      'broker_messages_waiting',
      "Messages in the Service Broker queue not moved to its table queue yet (every process). The handlers' backlog is the table queue's (sqlqueue_jobs).",
      ['queue'],
      (g, r) => {
        for (const q of r.queues) if (q.database) g.set({ queue: q.queue }, q.database.messagesWaiting);
      },
    );
    gauge(
      'broker_receivers',
      "This process's receivers of the broker queue; state busy (moving messages) or idle (waiting in RECEIVE).",
      ['queue', 'state'],
      (g, r) => {
        for (const q of r.queues) {
          g.set({ queue: q.queue, state: 'busy' }, q.busyReceivers);
          g.set({ queue: q.queue, state: 'idle' }, Math.max(0, q.receivers - q.busyReceivers));
        }
      },
    );
    gauge(
      'broker_conversation_endpoints',
      'Conversation endpoints of the database by state. DISCONNECTED_INBOUND that keeps growing is an endpoint leak: one side never ends its conversations.',
      ['state'],
      (g, r) => {
        for (const [state, count] of Object.entries(r.endpoints)) g.set({ state }, count);
      },
    );
    counter(
      'broker_messages_moved_total',
      "Messages this process's receivers moved from the Service Broker queue into its table queue, whose job metrics follow them from there.",
      ['queue'],
      (c, r) => {
        for (const q of r.queues) c.inc({ queue: q.queue }, q.moved);
      },
    );
    counter(
      'broker_conversations_ended_total',
      "Conversations this process's receivers ended because the other side ended them (EndDialog or Error).",
      ['queue'],
      (c, r) => {
        for (const q of r.queues) c.inc({ queue: q.queue }, q.ended);
      },
    );
    counter(
      'broker_activations_total',
      'Receivers this process started for the broker queue, by source: a QUEUE_ACTIVATION notification, or the slow poll (a lost notification).',
      ['queue', 'source'],
      (c, r) => {
        for (const q of r.queues) {
          c.inc({ queue: q.queue, source: 'notification' }, q.activations.notification);
          c.inc({ queue: q.queue, source: 'poll' }, q.activations.poll);
        }
      },
    );
    counter(
      'broker_notification_lost_total',
      'Times the activation event notification of the queue was found missing or broken (and recreated when possible).',
      ['queue'],
      (c, r) => {
        for (const q of r.queues) c.inc({ queue: q.queue }, q.notificationLost);
      },
    );
  }

  /**
   * Removes the metrics from the registry, so a registry shared across app instances stays
   * usable. At application shutdown, after the consumer drained, so its last completions count.
   */
  onApplicationShutdown(): void {
    // The engine's listener list cannot shrink; a closed exporter just ignores later events.
    this.closed = true;
    for (const name of this.names.splice(0)) this.registry.removeSingleMetric(name);
  }

  /** A gauge refilled at scrape time from a shared reading (read once per scrape for all of them). */
  private readingGauge<R>(
    read: () => Promise<R>,
    suffix: string,
    help: string,
    labelNames: string[],
    fill: (gauge: Gauge<string>, reading: R) => void,
  ): void {
    new Gauge({
      name: this.name(suffix),
      help,
      labelNames,
      registers: [this.registry],
      async collect() {
        const reading = await read();
        this.reset();
        fill(this, reading);
      },
    });
  }

  /** A counter refilled at scrape time from a shared reading of this process's counts. */
  private readingCounter<R>(
    read: () => Promise<R>,
    suffix: string,
    help: string,
    labelNames: string[],
    fill: (counter: Counter<string>, reading: R) => void,
  ): void {
    new Counter({
      name: this.name(suffix),
      help,
      labelNames,
      registers: [this.registry],
      async collect() {
        const reading = await read();
        this.reset();
        fill(this, reading);
      },
    });
  }

  /** Claims a metric name, refusing one the registry already holds (recorded only if ours). */
  private name(suffix: string): string {
    const name = `${this.prefix}${suffix}`;
    if (this.registry.getSingleMetric(name)) {
      throw new SqlQueueConfigError(
        `the Prometheus registry already has a metric named '${name}': give each SqlQueuePrometheusModule its own registry or prefix`,
      );
    }
    this.names.push(name);
    return name;
  }

  private registerDatabaseGauges(metrics: SqlQueueMetrics): void {
    const registers = [this.registry];
    const windowSeconds = metrics.options.failureWindowMs / 1000;
    // Every database gauge is filled from the same reading; the reader caches and shares it.
    const reading = (): Promise<QueueHealthReading> => metrics.readDatabase();
    const fromReading = (fill: (gauge: Gauge<string>, r: QueueHealthReading) => void) =>
      async function collect(this: Gauge<string>): Promise<void> {
        const r = await reading();
        this.reset();
        if (r.ok) fill(this, r);
      };

    new Gauge({
      name: this.name('stats_up'),
      help: 'Whether the last scrape could read the queue figures from the database in time (1) or not (0).',
      registers,
      async collect() {
        this.set((await reading()).ok ? 1 : 0);
      },
    });
    new Gauge({
      name: this.name('stats_duration_seconds'),
      help: 'How long the database reading used by this scrape took (or was waited for, when it failed).',
      registers,
      async collect() {
        this.set((await reading()).durationMs / 1000);
      },
    });
    new Gauge({
      name: this.name('stats_age_seconds'),
      help: 'Age of the database reading used by this scrape (readings are cached briefly and shared).',
      registers,
      async collect() {
        const r = await reading();
        this.reset();
        if (r.readAt !== null) this.set(Math.max(0, Date.now() - r.readAt) / 1000);
      },
    });
    new Gauge({
      name: this.name('jobs'),
      help: 'Jobs per queue and state, all workers: ready (due now), delayed (not due yet), leased (running somewhere), dead. Finished jobs are not counted.',
      labelNames: ['queue', 'state'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) {
          gauge.set({ queue: q.queue, state: 'ready' }, q.ready);
          gauge.set({ queue: q.queue, state: 'delayed' }, q.delayed);
          gauge.set({ queue: q.queue, state: 'leased' }, q.leased);
          gauge.set({ queue: q.queue, state: 'dead' }, q.dead);
        }
      }),
    });
    new Gauge({
      name: this.name('oldest_ready_age_seconds'),
      help: 'How long the oldest due job of the queue has been waiting (0 when none waits): the job a queue length hides.',
      labelNames: ['queue'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) gauge.set({ queue: q.queue }, q.oldestReadyAgeMs / 1000);
      }),
    });
    new Gauge({
      name: this.name('expired_leases'),
      help: 'Leased jobs whose lease has already ended and that the reaper has not returned yet (a worker died or hung).',
      labelNames: ['queue'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) gauge.set({ queue: q.queue }, q.expiredLeases);
      }),
    });
    new Gauge({
      name: this.name('retrying_jobs'),
      help: 'Ready jobs that have failed at least once and wait for another attempt.',
      labelNames: ['queue'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) gauge.set({ queue: q.queue }, q.retrying);
      }),
    });
    new Gauge({
      name: this.name('blocked_groups'),
      help: 'Ordered groups stopped by a dead job (groupOnDead: block) until it is retried or purged.',
      labelNames: ['queue'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) gauge.set({ queue: q.queue }, q.blockedGroups);
      }),
    });
    new Gauge({
      name: this.name('queue_paused'),
      help: 'Whether the queue is paused (pauseQueue): 1 while no instance claims from it, 0 otherwise.',
      labelNames: ['queue'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) gauge.set({ queue: q.queue }, q.paused ? 1 : 0);
      }),
    });
    new Gauge({
      name: this.name('repeatedly_failing_jobs'),
      help: `Unfinished jobs (ready or leased) that have already failed at least ${metrics.options.repeatedFailures} times.`,
      labelNames: ['queue'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) gauge.set({ queue: q.queue }, q.repeatedlyFailing);
      }),
    });
    new Gauge({
      name: this.name('recent_failures'),
      help: `Attempts that ended badly in the last ${windowSeconds} s, on every worker: outcome "failed" (handler error or timeout) or "lease_expired" (reaped).`,
      labelNames: ['queue', 'outcome'],
      registers,
      collect: fromReading((gauge, r) => {
        for (const q of r.queues) {
          gauge.set({ queue: q.queue, outcome: 'failed' }, q.recentFailures);
          gauge.set({ queue: q.queue, outcome: 'lease_expired' }, q.recentLeaseExpiries);
        }
      }),
    });
    new Gauge({
      name: this.name('failure_window_seconds'),
      help: 'The window of sqlqueue_recent_failures, in seconds.',
      registers,
      collect() {
        this.set(windowSeconds);
      },
    });
  }

  private registerProcessMetrics(metrics: SqlQueueMetrics): void {
    const registers = [this.registry];
    const buckets = [...metrics.options.latencyBucketsSeconds];
    const queueLabel = ['queue'] as const;

    // Counters read SqlQueueMetrics' own event counts at scrape time: one count of each event,
    // the same figures as processFigures(), and known queues start at zero so rate() and
    // absent() work before the first event.
    const fromFigures = <L extends string>(fill: (counter: Counter<L>, figures: SqlQueueProcessFigures) => void) =>
      function collect(this: Counter<L>): void {
        this.reset();
        for (const figures of metrics.processFigures()) fill(this, figures);
      };
    new Counter({
      name: this.name('jobs_completed_total'),
      help: 'Jobs this process completed.',
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.completed)),
    });
    new Counter({
      name: this.name('jobs_failed_total'),
      help: 'Failed attempts recorded by this process; result "retry" (scheduled again) or "dead" (no attempts left, or unrecoverable).',
      labelNames: ['queue', 'result'],
      registers,
      collect: fromFigures((c, p) => {
        c.inc({ queue: p.queue, result: 'retry' }, p.retried);
        c.inc({ queue: p.queue, result: 'dead' }, p.deadLettered);
      }),
    });
    new Counter({
      name: this.name('lost_ownership_total'),
      help: 'Writes refused because this worker no longer owned the job (its claim token had changed), by the write that found out.',
      labelNames: ['queue', 'during'],
      registers,
      collect: fromFigures((c, p) => {
        for (const [during, count] of Object.entries(p.lostOwnership)) c.inc({ queue: p.queue, during }, count);
      }),
    });
    new Counter({
      name: this.name('jobs_abandoned_total'),
      help: 'Handlers that ignored their abort signal; the reader moved on and the lease decides the job.',
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.abandoned)),
    });
    new Counter({
      name: this.name('jobs_canceled_total'),
      help: 'Running jobs this process held that cancel() ended: their handlers were aborted and the attempt recorded as canceled. Ready and delayed jobs that cancel() ended before they ran are not counted: no consumer held them.',
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.canceled)),
    });
    new Counter({
      name: this.name('jobs_rate_limited_total'),
      help: 'Jobs whose handlers in this process met an outside limit (SqlQueueRateLimitedError, context.rateLimited()) and were postponed without counting an attempt.',
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.rateLimited)),
    });
    new Counter({
      name: this.name('group_repairs_total'),
      help: "Ordered groups whose cached state this process's repair sweep found inconsistent with their jobs and fixed. Should stay 0: each one is a bug or a manual edit.",
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.groupRepairs)),
    });
    new Counter({
      name: this.name('claims_total'),
      help: 'Claim statements sent by this process; result "jobs" or "empty" (an empty claim starts an idle pause).',
      labelNames: ['queue', 'result'],
      registers,
      collect: fromFigures((c, p) => {
        c.inc({ queue: p.queue, result: 'jobs' }, p.claims);
        c.inc({ queue: p.queue, result: 'empty' }, p.emptyClaims);
      }),
    });
    new Counter({
      name: this.name('jobs_claimed_total'),
      help: 'Jobs claimed by this process.',
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.claimedJobs)),
    });
    new Counter({
      name: this.name('reader_activations_total'),
      help: 'Readers started in this process for claimed jobs that found no idle reader (the activation rule).',
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.readerActivations)),
    });
    new Counter({
      name: this.name('reader_retirements_total'),
      help: 'Readers retired in this process after an empty claim (above minReaders).',
      labelNames: queueLabel,
      registers,
      collect: fromFigures((c, p) => c.inc({ queue: p.queue }, p.readerRetirements)),
    });

    // Histograms cannot be set from a snapshot, so they observe completions as they happen.
    // Histogram.zero() overwrites a label set, observations included: zero each queue once,
    // and only if nothing was observed for it yet.
    const histogramQueues = new Set<string>();
    const zeroHistograms = (queue: string) => {
      if (histogramQueues.has(queue)) return;
      histogramQueues.add(queue);
      duration.zero({ queue });
      latency.zero({ queue });
    };
    const zeroKnown = () => {
      for (const queue of metrics.knownQueues()) zeroHistograms(queue);
    };
    const duration: Histogram<'queue'> = new Histogram({
      name: this.name('job_duration_seconds'),
      help: 'Claim to completion of jobs completed by this process: the handler run plus recording the outcome.',
      labelNames: queueLabel,
      buckets,
      registers,
      collect: zeroKnown,
    });
    const latency: Histogram<'queue'> = new Histogram({
      name: this.name('job_latency_seconds'),
      help: 'Enqueue to completion of jobs completed by this process: waiting, retries and the run.',
      labelNames: queueLabel,
      buckets,
      registers,
      collect: zeroKnown,
    });
    metrics.addListener({
      completed: (e) => {
        if (this.closed) return;
        zeroHistograms(e.queue);
        duration.observe({ queue: e.queue }, e.claimToDoneMs / 1000);
        latency.observe({ queue: e.queue }, e.enqueueToDoneMs / 1000);
      },
    });

    new Gauge({
      name: this.name('readers'),
      help: 'Readers of the queue running in this process.',
      labelNames: queueLabel,
      registers,
      collect() {
        this.reset();
        for (const p of metrics.processFigures()) if (p.consumer) this.set({ queue: p.queue }, p.consumer.readers);
      },
    });
    new Gauge({
      name: this.name('jobs_running'),
      help: 'Handlers of the queue running in this process now.',
      labelNames: queueLabel,
      registers,
      collect() {
        this.reset();
        for (const p of metrics.processFigures()) if (p.consumer) this.set({ queue: p.queue }, p.consumer.running);
      },
    });
    new Gauge({
      name: this.name('claim_failing'),
      help: 'Whether claims of the queue are failing in this process right now (database unreachable, …).',
      labelNames: queueLabel,
      registers,
      collect() {
        this.reset();
        for (const p of metrics.processFigures()) {
          if (p.consumer) this.set({ queue: p.queue }, p.consumer.claimFailing ? 1 : 0);
        }
      },
    });
    new Gauge({
      name: this.name('claim_loop_idle_seconds'),
      help: 'Seconds since the claim loop of the queue last made progress in this process (claimed, paused or backed off).',
      labelNames: queueLabel,
      registers,
      collect() {
        this.reset();
        for (const p of metrics.processFigures()) {
          if (p.consumer) this.set({ queue: p.queue }, p.consumer.sinceLastLoopMs / 1000);
        }
      },
    });
  }
}
