import type { QueueEventListener } from '../core/events.js';
import { SqlQueueConfigError } from '../core/errors.js';
import {
  resolveConsumerOptions,
  resolveReaperOptions,
  resolveRetentionOptions,
  validateQueueMap,
  type ConsumerOptions,
  type QueueOptions,
  type ReaperOptions,
  type ResolvedConsumerOptions,
  type ResolvedReaperOptions,
  type ResolvedRetentionOptions,
  type RetentionOptions,
} from '../core/options.js';
import type { MigrationMode } from '../core/queue-store.js';
import { resolveMetricsOptions, type MetricsOptions, type ResolvedMetricsOptions } from '../core/metrics/index.js';
import {
  assertBoolean,
  assertInteger,
  assertOptionGroup,
  assertSchemaName,
  DEFAULT_MAX_PAYLOAD_BYTES,
  describe,
} from '../core/validation.js';
import { DEFAULT_WAKE_INTERVAL_MS } from '../core/wake.js';
import { DEFAULT_THROUGHPUT_FLUSH_MS } from '../core/throughput/index.js';
import { ENQUEUE_CHUNK } from '../core/producer/index.js';
import type { SqlQueueConnection } from '../store/create-store.js';
import { resolveBrokerOptions } from '../broker/broker.options.js';
import type { BrokerOptions, ResolvedBrokerOptions } from '../broker/broker.types.js';
import { validateScheduleDefinition, type ValidScheduleDefinition } from '../core/schedules/index.js';
import type { ScheduleDefinition } from '../core/schedules/index.js';

/** Options of `SqlQueueModule.forRoot()` / `forRootAsync()`. */
export interface SqlQueueModuleOptions {
  /** Where the queue lives: a dialect with a URL or config, an embedded PGlite, or your own pool. */
  connection: SqlQueueConnection;
  /** Database schema holding the queue tables (default 'sqlqueue'). */
  schema?: string;
  /** 'auto' installs/upgrades at boot under a lock, 'check' only verifies, 'off' skips (default 'auto'). */
  migrations?: MigrationMode;
  /** Per-queue defaults; `@QueueHandler` options override them. */
  queues?: Record<string, QueueOptions>;
  /** Whether and how this process runs handlers: polling, activation, shutdown. */
  consumer?: ConsumerOptions;
  /** The lease reaper: interval and batch size (it runs on every instance, safely). */
  reaper?: ReaperOptions;
  /** Deletion of old finished jobs, keeping idempotency keys for their window. */
  retention?: RetentionOptions;
  /** Largest payload accepted, in bytes of JSON (default 1 MiB). */
  maxPayloadBytes?: number;
  /**
   * Cross-process wake-ups (PostgreSQL LISTEN/NOTIFY), sent outside producer transactions:
   * per queue at most one in flight and one per `intervalMs` (default on, 2 ms).
   */
  wakeups?: { enabled?: boolean; intervalMs?: number };
  /** Receives engine events (claims, completions, failures, lost ownership, reader counts). */
  listeners?: QueueEventListener[];
  /** How SqlQueueMetrics measures: failure window, repeated-failure threshold, caching, histogram buckets. */
  metrics?: MetricsOptions;
  /**
   * Service Broker queues (SQL Server and Azure SQL Managed Instance only): `@QueueHandler(name)`
   * consumes a broker queue declared here, `QueueProducer.send(name, …)` sends to it.
   */
  broker?: BrokerOptions;
  /**
   * Recurring jobs by id, upserted at boot: each tick of `cron` (in `timezone`) enqueues one job
   * into `queue`, once across every instance. A schedule removed from here stays in the
   * database unless `pruneSchedules` is true.
   */
  schedules?: Record<string, ScheduleDefinition>;
  /** Delete schedules defined by an earlier boot's `schedules` option and missing from it now (default false). */
  pruneSchedules?: boolean;
  /** The loop that fires due schedules (every instance runs it; default on). */
  scheduler?: { enabled?: boolean; maxPollMs?: number };
  /**
   * Per-minute outcome counts (completed, failed, dead) per queue, added to the database every
   * `flushIntervalMs` (default 5000) by each process that has outcomes to add: the dashboard's
   * throughput chart. An increment per job, one statement per flush, none while idle (default on).
   */
  throughput?: { enabled?: boolean; flushIntervalMs?: number };
  /**
   * Concurrent single enqueues outside a caller's transaction share one statement and one commit
   * (default on): a lone enqueue goes out at once; calls made while a batch is in flight (or in
   * the same event-loop turn, or within `windowUs` microseconds) go out together as the next one,
   * each caller getting its own result or error.
   */
  enqueueBatching?: { enabled?: boolean; maxBatchSize?: number; maxInFlight?: number; windowUs?: number };
  /**
   * OpenTelemetry tracing through the optional peer `@opentelemetry/api` (default on; without an
   * SDK registered it records nothing): enqueue stores the trace context with the job, the handler
   * runs in a consumer span that is a `child` of (or has a `link` to) the producer's span.
   */
  tracing?: { enabled?: boolean; consumerSpan?: 'child' | 'link'; claimSpans?: boolean; reaperSpans?: boolean };
}

export interface ResolvedModuleOptions {
  connection: SqlQueueConnection;
  schema: string;
  migrations: MigrationMode;
  queues: Record<string, QueueOptions>;
  consumer: ResolvedConsumerOptions;
  reaper: ResolvedReaperOptions;
  retention: ResolvedRetentionOptions;
  maxPayloadBytes: number;
  wakeups: { enabled: boolean; intervalMs: number };
  listeners: QueueEventListener[];
  metrics: ResolvedMetricsOptions;
  broker: ResolvedBrokerOptions | null;
  /** Validated (JSON serialized, defaults filled in) before connecting; upserted once connected. */
  schedules: Record<string, ValidScheduleDefinition>;
  pruneSchedules: boolean;
  scheduler: { enabled: boolean; maxPollMs: number };
  throughput: { enabled: boolean; flushIntervalMs: number };
  enqueueBatching: { enabled: boolean; maxBatchSize: number; maxInFlight: number; windowUs: number };
  tracing: { enabled: boolean; consumerSpan: 'child' | 'link'; claimSpans: boolean; reaperSpans: boolean };
}

const KNOWN: readonly (keyof SqlQueueModuleOptions)[] = [
  'connection',
  'schema',
  'migrations',
  'queues',
  'consumer',
  'reaper',
  'retention',
  'maxPayloadBytes',
  'wakeups',
  'listeners',
  'metrics',
  'broker',
  'schedules',
  'pruneSchedules',
  'scheduler',
  'throughput',
  'enqueueBatching',
  'tracing',
];

/** Checks every module option at boot, with messages that name the option and the fix. */
export function resolveModuleOptions(raw: SqlQueueModuleOptions): ResolvedModuleOptions {
  assertOptionGroup('SqlQueueModule options', raw, KNOWN);
  if (!raw?.connection) throw new SqlQueueConfigError('SqlQueueModule: connection is required');
  const migrations = raw.migrations ?? 'auto';
  if (!['auto', 'check', 'off'].includes(migrations)) {
    throw new SqlQueueConfigError(`migrations must be 'auto', 'check' or 'off', got ${describe(migrations)}`);
  }
  const wakeups = assertOptionGroup('wakeups', raw.wakeups, ['enabled', 'intervalMs']);
  if (raw.listeners !== undefined && !Array.isArray(raw.listeners)) {
    throw new SqlQueueConfigError('listeners must be an array of event listener objects');
  }
  const schema = assertSchemaName(raw.schema ?? 'sqlqueue');
  const queues = validateQueueMap(raw.queues);
  const maxPayloadBytes = assertInteger(
    'maxPayloadBytes',
    raw.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES,
    2,
    64 * 1024 * 1024,
  );
  const schedules = Object.fromEntries(
    Object.entries(assertOptionGroup('schedules', raw.schedules) as Record<string, ScheduleDefinition>).map(
      ([id, definition]) => [id, validateScheduleDefinition(id, definition, maxPayloadBytes, SqlQueueConfigError)],
    ),
  );
  const scheduler = assertOptionGroup('scheduler', raw.scheduler, ['enabled', 'maxPollMs']);
  const consumer = resolveConsumerOptions(raw.consumer);
  const throughput = assertOptionGroup('throughput', raw.throughput, ['enabled', 'flushIntervalMs']);
  const batching = assertOptionGroup('enqueueBatching', raw.enqueueBatching, [
    'enabled',
    'maxBatchSize',
    'maxInFlight',
    'windowUs',
  ]);
  const tracing = assertOptionGroup('tracing', raw.tracing, ['enabled', 'consumerSpan', 'claimSpans', 'reaperSpans']);
  const consumerSpan = tracing.consumerSpan ?? 'child';
  if (consumerSpan !== 'child' && consumerSpan !== 'link') {
    throw new SqlQueueConfigError(`tracing.consumerSpan must be 'child' or 'link', got ${describe(consumerSpan)}`);
  }
  return {
    connection: raw.connection,
    schema,
    migrations,
    queues,
    consumer,
    reaper: resolveReaperOptions(raw.reaper),
    retention: resolveRetentionOptions(raw.retention),
    maxPayloadBytes,
    wakeups: {
      enabled: assertBoolean('wakeups.enabled', wakeups.enabled ?? true),
      intervalMs: assertInteger('wakeups.intervalMs', wakeups.intervalMs ?? DEFAULT_WAKE_INTERVAL_MS, 0, 60_000),
    },
    listeners: [...(raw.listeners ?? [])],
    metrics: resolveMetricsOptions(raw.metrics),
    broker: resolveBrokerOptions(raw.broker, schema, Object.keys(queues)),
    schedules,
    pruneSchedules: assertBoolean('pruneSchedules', raw.pruneSchedules ?? false),
    scheduler: {
      enabled: assertBoolean('scheduler.enabled', scheduler.enabled ?? true),
      maxPollMs: assertInteger('scheduler.maxPollMs', scheduler.maxPollMs ?? consumer.maxPollMs, 10, 300_000),
    },
    throughput: {
      enabled: assertBoolean('throughput.enabled', throughput.enabled ?? true),
      flushIntervalMs: assertInteger(
        'throughput.flushIntervalMs',
        throughput.flushIntervalMs ?? DEFAULT_THROUGHPUT_FLUSH_MS,
        100,
        60_000,
      ),
    },
    enqueueBatching: {
      enabled: assertBoolean('enqueueBatching.enabled', batching.enabled ?? true),
      maxBatchSize: assertInteger('enqueueBatching.maxBatchSize', batching.maxBatchSize ?? 500, 1, ENQUEUE_CHUNK),
      maxInFlight: assertInteger('enqueueBatching.maxInFlight', batching.maxInFlight ?? 2, 1, 64),
      windowUs: assertInteger('enqueueBatching.windowUs', batching.windowUs ?? 0, 0, 1_000),
    },
    tracing: {
      enabled: assertBoolean('tracing.enabled', tracing.enabled ?? true),
      consumerSpan,
      claimSpans: assertBoolean('tracing.claimSpans', tracing.claimSpans ?? false),
      reaperSpans: assertBoolean('tracing.reaperSpans', tracing.reaperSpans ?? false),
    },
  };
}
