import { randomBytes } from 'node:crypto';
import mssql from 'mssql';
import pg from 'pg';
import { systemClock } from '../lib/src/core/clock.js';
import { SqlQueueConsumer } from '../lib/src/core/consumer/consumer.js';
import { DEFAULT_THROUGHPUT_FLUSH_MS, ThroughputRecorder } from '../lib/src/core/throughput/index.js';
import type { QueueEventListener } from '../lib/src/core/events.js';
import { silentLogger } from '../lib/src/core/logger.js';
import { resolveConsumerOptions, resolveQueueOptions, type QueueOptions } from '../lib/src/core/options.js';
import { FinishWatch, QueueProducerCore } from '../lib/src/core/producer/index.js';
import type { JobContext } from '../lib/src/core/consumer/index.js';
import type { QueueStore } from '../lib/src/core/queue-store.js';
import { DEFAULT_WAKE_INTERVAL_MS, RemoteWaker, WakeBus } from '../lib/src/core/wake.js';
import { createQueueStore } from '../lib/src/store/create-store.js';
import { mssqlConfigFromUrl } from '../lib/src/store/mssql/mssql.config.js';
import { mssqlDropSchema } from '../lib/src/store/mssql/mssql.migrations.js';
import { resolveModuleOptions } from '../lib/src/nest/sql-queue.options.js';
import { NO_TRACING, type QueueTracer } from '../lib/src/core/tracing.js';
import { OtelQueueTracer } from '../lib/src/tracing/otel.tracer.js';
import type { DbCost } from './db-cost.js';

export const PG_URL = process.env.SQLQUEUE_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** A database the bench runs against. SQL Server runs only our side (no raw reference there). */
export interface Target {
  dialect: 'postgres' | 'mssql';
  url: string;
}

export const POSTGRES: Target = { dialect: 'postgres', url: PG_URL };

export interface Result {
  case: string;
  variant: string;
  value: number;
  unit: string;
  /** The raw reference measured in the same run, if this figure has one. */
  reference?: { name: string; value: number };
  /** Target from the benchmark issue, as a ratio of the reference or an absolute bound. */
  target?: string;
  pass?: boolean;
  /** What a job of this figure cost the database (PostgreSQL, counted on the wire: bench/db-cost.ts). */
  dbCost?: DbCost;
}

export function schemaName(label: string): string {
  return `bench_${label}_${randomBytes(3).toString('hex')}`;
}

export async function sql(url: string, text: string, params: unknown[] = []): Promise<pg.QueryResult> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await client.query(text, params);
  } finally {
    await client.end();
  }
}

export async function dropSchema(target: Target | string, schema: string): Promise<void> {
  const { dialect, url } = typeof target === 'string' ? postgresAt(target) : target;
  if (dialect === 'postgres') {
    await sql(url, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    return;
  }
  const pool = await new mssql.ConnectionPool(mssqlConfigFromUrl(url, { poolSize: 2 })).connect();
  try {
    await pool.request().input('schema', mssql.NVarChar(128), schema).batch(mssqlDropSchema());
  } finally {
    await pool.close();
  }
}

function postgresAt(url: string): Target {
  return { dialect: 'postgres', url };
}

/** A migrated store in a fresh schema; dropped by the caller's `finally`. */
export async function openStore(target: Target | string, schema: string, poolSize = 20): Promise<QueueStore> {
  const { dialect, url } = typeof target === 'string' ? postgresAt(target) : target;
  const connection = dialect === 'postgres' ? { dialect, url, poolSize } : { dialect, url, poolSize };
  const store = await createQueueStore(connection, { schema });
  await store.migrate('auto');
  return store;
}

/**
 * The module's default tracing with `@opentelemetry/api` installed and no SDK registered (what
 * an application that does not trace gets); SQLQUEUE_BENCH_TRACING=off measures without it.
 */
export const BENCH_TRACER: QueueTracer =
  process.env.SQLQUEUE_BENCH_TRACING === 'off'
    ? NO_TRACING
    : new OtelQueueTracer({
        consumerSpan: 'child',
        claimSpans: false,
        reaperSpans: false,
        clientId: `bench:${process.pid}`,
      });

/** The module's default `enqueueBatching`, resolved as `SqlQueueModule.forRoot()` resolves it. */
const DEFAULT_BATCHING = resolveModuleOptions({ connection: { dialect: 'postgres', url: PG_URL } }).enqueueBatching;

/**
 * The producer as the module builds it by default: single enqueues batched, local wake-ups,
 * and NOTIFY where the store has it. The variants turn one of them off.
 */
export function producerFor(
  store: QueueStore,
  wakeBus = new WakeBus(),
  { remoteWakeups = true, batching = true }: { remoteWakeups?: boolean; batching?: boolean } = {},
): QueueProducerCore {
  const remoteWaker =
    remoteWakeups && store.notify ? new RemoteWaker(store, DEFAULT_WAKE_INTERVAL_MS, silentLogger) : null;
  return new QueueProducerCore(
    store,
    {
      maxPayloadBytes: 1 << 20,
      maxAttemptsFor: () => 25,
      enqueueBatching: { ...DEFAULT_BATCHING, enabled: batching },
      tracer: BENCH_TRACER,
    },
    wakeBus,
    remoteWaker,
  );
}

/**
 * The engine exactly as the Nest consumer host builds it, minus Nest: with the module's default
 * throughput recorder among its listeners, stopped (its last counts sent) with the consumer.
 */
export function consumerFor(
  store: QueueStore,
  queues: { queue: string; options: QueueOptions; handler: (payload: unknown, context: JobContext) => Promise<void> }[],
  listeners: QueueEventListener[],
  wakeBus = new WakeBus(),
): SqlQueueConsumer {
  const consumerOptions = resolveConsumerOptions({});
  const throughput = new ThroughputRecorder({
    store,
    clock: systemClock,
    logger: silentLogger,
    flushIntervalMs: DEFAULT_THROUGHPUT_FLUSH_MS,
  });
  const consumer = new SqlQueueConsumer({
    store,
    clock: systemClock,
    logger: silentLogger,
    // The runtime's finish watch too: every completion looks for waiters.
    listeners: [...listeners, throughput, new FinishWatch({ broadcast: null, listen: null, logger: silentLogger })],
    wakeBus,
    workerId: `bench:${process.pid}`,
    tracer: BENCH_TRACER,
  });
  for (const { queue, options, handler } of queues) {
    consumer.register(resolveQueueOptions(queue, { handler: options }, consumerOptions), handler);
  }
  throughput.start();
  const stopConsumer = consumer.stop.bind(consumer);
  consumer.stop = async (timeoutMs) => {
    await stopConsumer(timeoutMs);
    await throughput.stop(2_000);
  };
  return consumer;
}

export function perSecond(count: number, ms: number): number {
  return Math.round((count * 1000) / ms);
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[index]!;
}

/** Rejects if `work` runs past `ms`: every case is bounded in time. */
export async function bounded<T>(what: string, ms: number, work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      work,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

export async function runConcurrently(
  workers: number,
  total: number,
  task: (index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: workers }, async () => {
      for (;;) {
        const index = next++;
        if (index >= total) return;
        await task(index);
      }
    }),
  );
}

export function payload(i: number): { orderId: number; email: string; note: string } {
  return { orderId: i, email: `user${i}@example.com`, note: 'welcome' };
}
