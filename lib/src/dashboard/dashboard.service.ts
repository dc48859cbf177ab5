import { Inject, Injectable, NotFoundException, type OnModuleInit } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { SqlQueueConfigError, SqlQueueValidationError } from '../core/errors.js';
import { checkJobListRequest } from '../core/listing/index.js';
import { assertJobId } from '../core/producer/index.js';
import { THROUGHPUT_MAX_MINUTES } from '../core/throughput/index.js';
import type { ScheduleRecord } from '../core/schedules/index.js';
import type {
  AttemptRecord,
  BlockedGroupPage,
  FlowUsage,
  CancelResult,
  JobId,
  JobListPage,
  JobRecord,
  ListedJobState,
  QueueHealth,
  ThroughputBucket,
  ThroughputReading,
} from '../core/types.js';
import { assertInteger, assertKeyText, assertOptionGroup, describe } from '../core/validation.js';
import { QueueProducer } from '../nest/queue.producer.js';
import { SqlQueueMetrics } from '../nest/sql-queue.metrics.js';
import type { SqlQueueRuntime } from '../nest/sql-queue.runtime.js';
import { SQL_QUEUE_RUNTIME } from '../nest/sql-queue.tokens.js';
import { SQL_QUEUE_DASHBOARD_OPTIONS, type ResolvedDashboardOptions } from './dashboard.options.js';

/** `GET api/overview`: every queue's live figures, as the page's overview table shows them. */
export interface DashboardOverview {
  now: Date;
  readOnly: boolean;
  refreshMs: number;
  /** The window of `recentFailures` and `recentLeaseExpiries`. */
  failureWindowMs: number;
  /** Why the figures could not be read (the queues are then empty); null when they were. */
  databaseError: string | null;
  queues: QueueHealth[];
}

/** `GET api/throughput`: per-minute outcomes of every queue, oldest first. */
export interface DashboardThroughput {
  /** The database's clock when read. */
  now: Date;
  minutes: number;
  buckets: ThroughputBucket[];
}

/** `GET api/jobs/:id`: everything about one job but its claim token. */
export interface DashboardJobDetail {
  job: Omit<JobRecord, 'claimToken'>;
  attempts: AttemptRecord[];
}

/** SqlQueueModule's providers, found at init, and the throughput cache over its store. */
interface FoundParts {
  runtime: SqlQueueRuntime;
  producer: QueueProducer;
  metrics: SqlQueueMetrics;
  throughput: ThroughputCache;
}

/** Throughput is counted per minute: a chart refreshed by many tabs costs one statement per window. */
export const THROUGHPUT_CACHE_MS = 15_000;
/** Ids one retry or purge request may name. */
export const MAX_ACTION_IDS = 1000;
const MAX_LIST_LIMIT = 500;

/**
 * What the dashboard reads and does, through the queue's own API (QueueProducer,
 * SqlQueueMetrics) and its store port, so it works on every dialect. Knows nothing of HTTP
 * frameworks: its inputs are the raw route and query values, checked here (a bad one throws
 * SqlQueueValidationError, answered with a 400), and its results are plain objects.
 */
@Injectable()
export class SqlQueueDashboardService implements OnModuleInit {
  private found: FoundParts | null = null;

  constructor(
    @Inject(SQL_QUEUE_DASHBOARD_OPTIONS) readonly options: ResolvedDashboardOptions,
    private readonly moduleRef: ModuleRef,
  ) {}

  /** Finds SqlQueueModule's providers anywhere in the application (fails the boot if absent). */
  onModuleInit(): void {
    try {
      const runtime = this.moduleRef.get<SqlQueueRuntime>(SQL_QUEUE_RUNTIME, { strict: false });
      this.found = {
        runtime,
        producer: this.moduleRef.get(QueueProducer, { strict: false }),
        metrics: this.moduleRef.get(SqlQueueMetrics, { strict: false }),
        throughput: new ThroughputCache((minutes) => runtime.store.readThroughput(minutes), THROUGHPUT_CACHE_MS),
      };
    } catch (error) {
      throw new SqlQueueConfigError(
        'SqlQueueDashboardModule needs SqlQueueModule: import SqlQueueModule.forRoot() or forRootAsync() in your application',
        { cause: error },
      );
    }
  }

  private get parts(): FoundParts {
    if (!this.found) throw new SqlQueueConfigError('SqlQueueDashboardService is used before its module initialized');
    return this.found;
  }

  /**
   * The figures of every queue, from the cached reading Prometheus scrapes share (one statement
   * for all queues), at most `refreshMs` old. Queues this application knows, and queues with outcomes in the last hour,
   * are listed with zeros when the reading has nothing of them.
   */
  async overview(): Promise<DashboardOverview> {
    const { runtime, metrics, throughput } = this.parts;
    // Only names are wanted from it: a failed reading just lists fewer empty queues.
    const recent = await throughput.get(60).then(
      (r) => r.buckets.map((b) => b.queue),
      () => [],
    );
    const reading = await metrics.readDatabase({
      // As fresh as the page refreshes (never fresher than scrapes get: open tabs share it too).
      maxAgeMs: Math.min(this.options.refreshMs, metrics.options.cacheMs),
      alsoQueues: [...runtime.handlerOptions.keys(), ...recent],
    });
    return {
      now: new Date(),
      readOnly: this.options.readOnly,
      refreshMs: this.options.refreshMs,
      failureWindowMs: metrics.options.failureWindowMs,
      databaseError: reading.error,
      queues: reading.queues,
    };
  }

  /** Per-minute outcomes over the last `minutes` (1..THROUGHPUT_MAX_MINUTES, default 60), read at most once per 15 s per window. */
  async throughput(minutes: unknown): Promise<DashboardThroughput> {
    const window = intParam('minutes', minutes, 60, 1, THROUGHPUT_MAX_MINUTES);
    const reading = await this.parts.throughput.get(window);
    return { now: reading.now, minutes: window, buckets: reading.buckets };
  }

  /** One page of a queue's jobs in one state (default ready), `limit` 1..500 (default 50). */
  listJobs(queue: unknown, query: { state?: unknown; limit?: unknown; cursor?: unknown }): Promise<JobListPage> {
    const request = {
      queue: queue as string,
      state: (query.state === undefined || query.state === '' ? 'ready' : query.state) as ListedJobState,
      limit: intParam('limit', query.limit, 50, 1, MAX_LIST_LIMIT),
      cursor: (query.cursor || null) as string | null,
    };
    // Queue, state and cursor are checked before the database is touched (a malformed cursor
    // is a 400, not a failed statement); the store checks them again, as it trusts no caller.
    checkJobListRequest(request);
    return this.parts.runtime.store.listJobs(request);
  }

  /** A job and its attempts; 404 when there is no such job (never existed, or cleaned up). */
  async job(id: unknown): Promise<DashboardJobDetail> {
    const jobId = assertJobId(id);
    const { producer } = this.parts;
    const [record, attempts] = await Promise.all([producer.getJob(jobId), producer.getAttempts(jobId)]);
    if (!record) {
      throw new NotFoundException(`no job ${jobId}: it never existed, or it finished and was cleaned up`);
    }
    // The claim token is the running worker's proof of ownership: it never leaves the server.
    const { claimToken: _token, ...job } = record;
    return { job, attempts };
  }

  /** Ordered groups a dead job blocks, by group key, `limit` 1..500 (default 50) after `after`. */
  blockedGroups(queue: unknown, query: { after?: unknown; limit?: unknown }): Promise<BlockedGroupPage> {
    return this.parts.producer.listBlockedGroups(queue as string, {
      limit: intParam('limit', query.limit, 50, 1, MAX_LIST_LIMIT),
      // A position is a group key: one no group can have (U+0000) would fail the statement, a 500.
      afterKey:
        query.after === undefined || query.after === '' ? null : assertKeyText('blocked groups', 'after', query.after),
    });
  }

  /** A queue's flow limits, running jobs, rate window and its busiest keys (`limit` 1..100, default 10). */
  flow(queue: unknown, query: { limit?: unknown }): Promise<FlowUsage> {
    return this.parts.producer.flowUsage(queue as string, { top: intParam('limit', query.limit, 10, 1, 100) });
  }

  async schedules(): Promise<{ schedules: ScheduleRecord[] }> {
    return { schedules: await this.parts.producer.listSchedules() };
  }

  /** Dead jobs of a queue back to ready with a fresh attempt budget: `{ ids }` or `{ all: true }`. */
  async retryDead(queue: unknown, body: unknown): Promise<{ retried: JobId[] }> {
    return { retried: await this.parts.producer.retryDead(queue as string, deadJobsOf(body)) };
  }

  /** Deletes dead jobs of a queue: `{ ids }` or `{ all: true }`. */
  async purgeDead(queue: unknown, body: unknown): Promise<{ purged: number }> {
    const target = deadJobsOf(body);
    return {
      purged: await this.parts.producer.purgeDead(queue as string, target === 'all' ? {} : { ids: target }),
    };
  }

  /** Cancels a job (ready, delayed or running); says what happened (see CancelOutcome). */
  cancelJob(id: unknown): Promise<CancelResult> {
    return this.parts.producer.cancel(assertJobId(id), { reason: 'canceled from the dashboard' });
  }

  /** Pauses a queue on every instance, `{ reason? }`; `paused` is false when it was paused already. */
  async pauseQueue(queue: unknown, body: unknown): Promise<{ paused: boolean }> {
    const reason = reasonOf(body);
    const paused = await this.parts.producer.pauseQueue(
      queue as string,
      reason === undefined ? {} : { reason: reason as string },
    );
    await this.freshOverview();
    return { paused };
  }

  /** Ends a queue's pause; `resumed` is false when it was not paused. */
  async resumeQueue(queue: unknown): Promise<{ resumed: boolean }> {
    const resumed = await this.parts.producer.resumeQueue(queue as string);
    await this.freshOverview();
    return { resumed };
  }

  /** After a pause or resume, the shared reading is read again, so the page shows the change at once. */
  private async freshOverview(): Promise<void> {
    await this.parts.metrics.readDatabase({ maxAgeMs: 0 }).catch(() => undefined);
  }

  async pauseSchedule(id: unknown): Promise<{ ok: true }> {
    await this.parts.producer.pauseSchedule(await this.existingSchedule(id));
    return { ok: true };
  }

  async resumeSchedule(id: unknown): Promise<{ ok: true }> {
    await this.parts.producer.resumeSchedule(await this.existingSchedule(id));
    return { ok: true };
  }

  async triggerSchedule(id: unknown): Promise<{ jobId: JobId; created: boolean; tick: Date }> {
    const { jobId, created, tick } = await this.parts.producer.triggerSchedule(await this.existingSchedule(id));
    return { jobId, created, tick };
  }

  /** The id of a schedule that exists (validated by getSchedule), else a 404. */
  private async existingSchedule(id: unknown): Promise<string> {
    const schedule = await this.parts.producer.getSchedule(id as string);
    if (!schedule) throw new NotFoundException(`no schedule '${String(id)}': it may have been deleted`);
    return schedule.id;
  }
}

/** `{ ids: [...] }` (1 to 1000 job ids) or `{ all: true }`, from an action's JSON body. */
function deadJobsOf(body: unknown): JobId[] | 'all' {
  const shape = `the body must be { "ids": ["42", …] } (1 to ${MAX_ACTION_IDS} job ids) or { "all": true }`;
  const { ids, all } = assertOptionGroup<{ ids?: unknown; all?: unknown }>(
    'request body',
    (body ?? undefined) as object | undefined,
    ['ids', 'all'],
    SqlQueueValidationError,
  );
  if (all === true && ids === undefined) return 'all';
  if (all !== undefined && all !== false) throw new SqlQueueValidationError(shape);
  if (!Array.isArray(ids) || ids.length === 0 || ids.length > MAX_ACTION_IDS) {
    throw new SqlQueueValidationError(`${shape}, got ids ${Array.isArray(ids) ? `of ${ids.length}` : describe(ids)}`);
  }
  return ids.map((id) => assertJobId(id));
}

/** `{ reason? }` from a pause's JSON body; the producer checks the reason itself. */
function reasonOf(body: unknown): unknown {
  const { reason } = assertOptionGroup<{ reason?: unknown }>(
    'request body',
    (body ?? undefined) as object | undefined,
    ['reason'],
    SqlQueueValidationError,
  );
  return reason;
}

/** An integer from a query string (absent or empty: `fallback`). */
function intParam(name: string, value: unknown, fallback: number, min: number, max: number): number {
  if (value === undefined || value === '') return fallback;
  const number = typeof value === 'string' && /^-?\d{1,16}$/.test(value) ? Number(value) : value;
  return assertInteger(name, number, min, max, SqlQueueValidationError);
}

/**
 * Throughput readings by window, each shared by every request for `maxAgeMs` and by concurrent
 * requests while it is read. A failed reading is dropped at once, so the next request reads
 * again. Windows not asked for within `maxAgeMs` are forgotten.
 */
export class ThroughputCache {
  private readonly readings = new Map<number, { at: number; reading: Promise<ThroughputReading> }>();

  constructor(
    private readonly read: (minutes: number) => Promise<ThroughputReading>,
    private readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  get(minutes: number): Promise<ThroughputReading> {
    const now = this.now();
    for (const [key, entry] of this.readings) if (now - entry.at >= this.maxAgeMs) this.readings.delete(key);
    let entry = this.readings.get(minutes);
    if (!entry) {
      const reading = this.read(minutes);
      const created = { at: now, reading };
      entry = created;
      this.readings.set(minutes, created);
      reading.catch(() => {
        if (this.readings.get(minutes) === created) this.readings.delete(minutes);
      });
    }
    return entry.reading;
  }
}
