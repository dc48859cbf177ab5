import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import {
  QueueEventMetrics,
  resolveMetricsOptions,
  type QueueHealthReading,
} from '../../lib/src/core/metrics/queue-metrics.js';
import { SqlQueueMetrics, type SqlQueueScheduleReading } from '../../lib/src/index.js';
import { SqlQueuePrometheusExporter } from '../../lib/src/prometheus.js';
import { parsePrometheusText, sampleValue } from '../helpers/prometheus-text.js';

/** The exporter over a stand-in SqlQueueMetrics: what it prints for given readings and events. */
function setup(options: { registry?: Registry; reading?: () => QueueHealthReading } = {}) {
  const listeners: QueueEventListener[] = [];
  const okReading = (): QueueHealthReading => ({
    ok: true,
    readAt: Date.now(),
    durationMs: 3,
    error: null,
    queues: [
      {
        queue: 'mail.out-1',
        ready: 2,
        delayed: 1,
        leased: 1,
        expiredLeases: 1,
        dead: 4,
        retrying: 1,
        blockedGroups: 3,
        oldestReadyAgeMs: 90_000,
        paused: true,
        recentFailures: 5,
        recentLeaseExpiries: 1,
        repeatedlyFailing: 1,
      },
    ],
  });
  // Events are counted as SqlQueueMetrics counts them: by a real QueueEventMetrics.
  const events = new QueueEventMetrics();
  listeners.push(events);
  const metrics = {
    options: resolveMetricsOptions({}),
    readDatabase: async () => (options.reading ?? okReading)(),
    knownQueues: () => ['mail.out-1'],
    processFigures: () => [
      {
        ...events.figures('mail.out-1'),
        consumer: { readers: 2, running: 1, buffered: 0, claimFailing: false, stopping: false, sinceLastLoopMs: 1500 },
      },
    ],
    addListener: (listener: QueueEventListener) => listeners.push(listener),
    scheduleTickCounts: () => [{ id: 'report.daily', queue: 'mail.out-1', fired: 3, skipped: 2 }],
    readScale: async () => ({
      ok: true,
      readAt: Date.now(),
      durationMs: 2,
      error: null,
      queues: [
        {
          queue: 'mail.out-1',
          inputs: {
            claimable: 600,
            running: 4,
            completedInWindow: 1_200,
            busyMsInWindow: 480_000,
            windowMs: 300_000,
            paused: false,
            globalConcurrency: null,
            rateMax: null,
            ratePerMs: null,
          },
          desiredReaders: 14,
          recommendedReaders: 23,
          maxReaders: 10,
          desiredWorkers: 3,
        },
      ],
    }),
    readSchedules: async (): Promise<SqlQueueScheduleReading> => ({
      ok: true,
      error: null,
      durationMs: 1,
      schedules: [
        {
          id: 'report.daily',
          queue: 'mail.out-1',
          paused: false,
          nextRunAt: new Date('2026-12-02T02:30:00.000Z'),
          lastRunAt: new Date('2026-12-01T02:30:00.250Z'),
          lagMs: 1_500,
          fired: 3,
          skipped: 2,
        },
        {
          id: 'paused.one',
          queue: 'mail.out-1',
          paused: true,
          nextRunAt: null,
          lastRunAt: null,
          lagMs: 0,
          fired: 0,
          skipped: 0,
        },
      ],
    }),
  };
  const moduleRef = { get: (token: unknown) => (token === SqlQueueMetrics ? metrics : null) };
  const exporter = new SqlQueuePrometheusExporter(
    options.registry ? { registry: options.registry } : {},
    moduleRef as never,
  );
  exporter.onModuleInit();
  const emit = <K extends keyof QueueEventListener>(
    name: K,
    event: Parameters<NonNullable<QueueEventListener[K]>>[0],
  ) => {
    for (const l of listeners) (l[name] as ((e: typeof event) => void) | undefined)?.call(l, event);
  };
  const scrape = async () => parsePrometheusText(await exporter.metrics());
  return { exporter, emit, scrape };
}

describe('SqlQueuePrometheusExporter', () => {
  it('prints database gauges, process gauges, counters and histograms as valid Prometheus text', async () => {
    const { emit, scrape } = setup();
    const q = { queue: 'mail.out-1' };
    emit('claimed', { queue: q.queue, count: 2, limit: 5, durationMs: 3 });
    emit('completed', { queue: q.queue, jobId: '1', attempt: 1, enqueueToDoneMs: 1_200, claimToDoneMs: 40 });
    emit('failed', { queue: q.queue, jobId: '2', attempt: 1, dead: false, error: 'x' });
    emit('lostOwnership', { queue: q.queue, jobId: '3', during: 'complete', outcome: 'lost' });
    emit('readersChanged', { queue: q.queue, readers: 2, reason: 'activation' });
    emit('canceled', { queue: q.queue, jobId: '5', reason: 'operator' });
    emit('rateLimited', { queue: q.queue, jobId: '6', delayMs: 1_000 });
    emit('groupRepaired', { queue: q.queue, groupKey: 'order-7', problem: 'head 9 is not the first unfinished job 8' });
    const m = await scrape();
    expect(sampleValue(m, 'sqlqueue_stats_up')).toBe(1);
    const daily = { schedule: 'report.daily', queue: 'mail.out-1' };
    expect(sampleValue(m, 'sqlqueue_schedules_up')).toBe(1);
    expect(sampleValue(m, 'sqlqueue_schedule_next_fire_timestamp_seconds', daily)).toBe(
      Date.parse('2026-12-02T02:30:00.000Z') / 1000,
    );
    expect(sampleValue(m, 'sqlqueue_schedule_last_fire_timestamp_seconds', daily)).toBe(
      Date.parse('2026-12-01T02:30:00.250Z') / 1000,
    );
    expect(sampleValue(m, 'sqlqueue_schedule_lag_seconds', daily)).toBe(1.5);
    expect(sampleValue(m, 'sqlqueue_schedule_ticks_total', { ...daily, result: 'fired' })).toBe(3);
    expect(sampleValue(m, 'sqlqueue_schedule_ticks_total', { ...daily, result: 'skipped' })).toBe(2);
    expect(sampleValue(m, 'sqlqueue_schedule_paused', { schedule: 'paused.one', queue: 'mail.out-1' })).toBe(1);
    // A paused schedule has no next fire time to report, and one that never fired no last.
    expect(sampleValue(m, 'sqlqueue_schedule_next_fire_timestamp_seconds', { schedule: 'paused.one' })).toBeUndefined();
    expect(sampleValue(m, 'sqlqueue_schedule_last_fire_timestamp_seconds', { schedule: 'paused.one' })).toBeUndefined();
    expect(sampleValue(m, 'sqlqueue_scale_up')).toBe(1);
    // The stabilized recommendation, and pods from it at the queue's maxReaders.
    expect(sampleValue(m, 'sqlqueue_desired_readers', q)).toBe(23);
    expect(sampleValue(m, 'sqlqueue_desired_workers', q)).toBe(3);
    expect(sampleValue(m, 'sqlqueue_jobs', { ...q, state: 'dead' })).toBe(4);
    expect(sampleValue(m, 'sqlqueue_oldest_ready_age_seconds', q)).toBe(90);
    expect(sampleValue(m, 'sqlqueue_expired_leases', q)).toBe(1);
    expect(sampleValue(m, 'sqlqueue_blocked_groups', q)).toBe(3);
    expect(sampleValue(m, 'sqlqueue_queue_paused', q)).toBe(1);
    expect(sampleValue(m, 'sqlqueue_group_repairs_total', q)).toBe(1);
    expect(sampleValue(m, 'sqlqueue_recent_failures', { ...q, outcome: 'lease_expired' })).toBe(1);
    expect(sampleValue(m, 'sqlqueue_readers', q)).toBe(2);
    expect(sampleValue(m, 'sqlqueue_claim_loop_idle_seconds', q)).toBe(1.5);
    expect(sampleValue(m, 'sqlqueue_jobs_failed_total', { ...q, result: 'retry' })).toBe(1);
    expect(sampleValue(m, 'sqlqueue_jobs_failed_total', { ...q, result: 'dead' })).toBe(0);
    expect(sampleValue(m, 'sqlqueue_lost_ownership_total', { ...q, during: 'complete' })).toBe(1);
    expect(sampleValue(m, 'sqlqueue_reader_activations_total', q)).toBe(1);
    expect(sampleValue(m, 'sqlqueue_jobs_canceled_total', q)).toBe(1);
    expect(sampleValue(m, 'sqlqueue_jobs_rate_limited_total', q)).toBe(1);
    expect(sampleValue(m, 'sqlqueue_job_latency_seconds_bucket', { ...q, le: '1' })).toBe(0);
    expect(sampleValue(m, 'sqlqueue_job_latency_seconds_bucket', { ...q, le: '2.5' })).toBe(1);
    // Scraping again neither loses nor double counts an observation.
    emit('completed', { queue: q.queue, jobId: '4', attempt: 1, enqueueToDoneMs: 10, claimToDoneMs: 5 });
    const again = await scrape();
    expect(sampleValue(again, 'sqlqueue_job_duration_seconds_count', q)).toBe(2);
    expect(sampleValue(again, 'sqlqueue_jobs_completed_total', q)).toBe(2);
  });

  it('leaves the database gauges out and says so when the reading failed', async () => {
    const { scrape } = setup({
      reading: () => ({ ok: false, readAt: null, durationMs: 500, error: 'timed out', queues: [] }),
    });
    const m = await scrape();
    expect(sampleValue(m, 'sqlqueue_stats_up')).toBe(0);
    expect(sampleValue(m, 'sqlqueue_stats_duration_seconds')).toBe(0.5);
    expect(m.get('sqlqueue_jobs')?.samples).toEqual([]);
    // Process figures need no database.
    expect(sampleValue(m, 'sqlqueue_readers', { queue: 'mail.out-1' })).toBe(2);
  });

  it('registers on a shared registry and removes its metrics when the application closes', async () => {
    const registry = new Registry();
    const first = setup({ registry });
    expect(registry.getMetricsAsArray().length).toBeGreaterThan(10);
    const count = registry.getMetricsAsArray().length;
    // A second exporter on the same registry is refused with a clear error, and its failure
    // does not take the first one's metrics with it.
    expect(() => setup({ registry })).toThrow(/already has a metric named 'sqlqueue_stats_up'/);
    expect(registry.getMetricsAsArray()).toHaveLength(count);
    first.exporter.onApplicationShutdown();
    expect(registry.getMetricsAsArray()).toEqual([]);
    const second = setup({ registry });
    expect(sampleValue(await second.scrape(), 'sqlqueue_stats_up')).toBe(1);
  });

  it('refuses a prefix that would make invalid metric names', () => {
    expect(() => new SqlQueuePrometheusExporter({ prefix: 'bad-prefix' }, {} as never)).toThrow(/prefix/);
  });
});
