import { retryDelayFor, type BackoffOption, type RetryDelay } from './backoff.js';
import { SqlQueueConfigError } from './errors.js';
import type { FlowLimits, GroupOnDead, RateLimit } from './types.js';
import {
  assertBoolean,
  assertInteger,
  assertOptionGroup,
  assertQueueName,
  describe,
  DEFAULT_MAX_ATTEMPTS,
  INT_MAX,
  DAY_MS,
  MAX_AGE_MS,
  MAX_ATTEMPTS_LIMIT,
} from './validation.js';

/**
 * Claims of up to 100 jobs: measured on PostgreSQL, a claim of 100 costs about as much as a
 * claim of 10 (the round trip dominates), and claims are sized to free slots anyway.
 */
const DEFAULT_BATCH_SIZE = 100;

/** Per-queue behaviour, set in the module's `queues` map and overridable on `@QueueHandler`. */
export interface QueueOptions {
  /** Readers kept running even when the queue is empty (default 1). */
  minReaders?: number;
  /**
   * Most handlers of this queue running at once in this process (default 5). Readers start
   * as claimed work arrives, up to this, and retire after empty claims down to minReaders.
   */
  maxReaders?: number;
  /** Most jobs one claim statement takes (default 100). */
  batchSize?: number;
  /**
   * Jobs claimed ahead of free readers, held leased in memory, heartbeated, and given back on
   * shutdown (default 'auto': enough to cover two claim round trips at the handlers' recent
   * pace, at most 2 × batchSize, so short jobs never wait on a claim and long jobs get none; a
   * number fixes it, 0 turns it off).
   */
  prefetch?: number | 'auto';
  /** Lease length; heartbeats renew it every third of it while the handler runs (default 30 s). */
  leaseMs?: number;
  /** Longest a handler may run; then its signal aborts and the job fails (default 1 h, null: none). */
  maxDurationMs?: number | null;
  /** Attempts before a job is dead (default 25). Stored per job at enqueue. */
  maxAttempts?: number;
  /** Delay before retrying a failed job (default exponential from 1 s, ×2, max 1 h, equal jitter). */
  backoff?: BackoffOption;
  /** Shortest pause after an empty claim (default from `consumer.minPollMs`). */
  minPollMs?: number;
  /** Longest pause after empty claims (default from `consumer.maxPollMs`). */
  maxPollMs?: number;
  /**
   * Ordered groups (jobs enqueued with a `groupKey`): when one of a group's jobs dies, `continue`
   * (default) runs the group's next job; `block` stops the group until the dead job is retried
   * or purged (see `stats().blockedGroups` and `listBlockedGroups`). Recorded in the database at
   * boot, so every process applies the queue's consumers' choice.
   */
  groupOnDead?: GroupOnDead;
  /**
   * Jobs of one ordered group leased together by one claim and run in order by one reader
   * (default 1). Larger batches save round trips for deep groups; a job not due yet ends a
   * batch, a failure gives the rest back, and `maxDurationMs` counts from the batch's claim (past
   * half of it, the rest of the batch is given back).
   */
  groupBatchSize?: number;
  /**
   * Most jobs of this queue running at once across all instances (flow control; `maxReaders`
   * is per process). Enforced by the claim in the database.
   */
  globalConcurrency?: number;
  /**
   * Most jobs of one `concurrencyKey` running at once across all instances; jobs of other keys
   * are unaffected and claims take keys in turn.
   */
  concurrencyPerKey?: number;
  /** Most job starts of this queue in any window of `perMs` (sliding window, database clock). */
  rateLimit?: RateLimit;
  /** Most job starts of one `concurrencyKey` in any window of `perMs`. */
  rateLimitPerKey?: RateLimit;
  /**
   * Run each handler in a transaction of its own on the queue's database (`context.transaction`),
   * which also records the job's completion: the handler's writes and the completion commit
   * together, or not at all (default false). Each running handler holds a connection of the
   * store's pool until it commits.
   */
  transactional?: boolean;
}

export interface ConsumerOptions {
  /** Run handlers in this process (default true). A producer-only app sets false. */
  enabled?: boolean;
  /** How long shutdown waits for running handlers before aborting them (default 10 s). */
  shutdownTimeoutMs?: number;
  /** Default shortest pause after an empty claim (50 ms). */
  minPollMs?: number;
  /** Default longest pause after empty claims (2 s). */
  maxPollMs?: number;
  /** Identifies this process in job rows and attempt history (default host:pid:random). */
  workerId?: string;
}

export interface ReaperOptions {
  /** Run the lease reaper in this process (default true; safe on every instance at once). */
  enabled?: boolean;
  intervalMs?: number;
  batchSize?: number;
}

export interface RetentionOptions {
  /** Delete old finished jobs periodically (default true). */
  enabled?: boolean;
  intervalMs?: number;
  /** Keep done jobs this long (default 7 days). */
  doneMs?: number;
  /** Keep dead jobs this long; null keeps them until purged (default null). */
  deadMs?: number | null;
  /** Keep a finished job with an idempotency key at least this long, so the key still dedupes (7 days). */
  idempotencyKeyMs?: number;
  batchSize?: number;
}

export interface ResolvedQueueOptions {
  queue: string;
  minReaders: number;
  maxReaders: number;
  batchSize: number;
  prefetch: number | 'auto';
  leaseMs: number;
  maxDurationMs: number | null;
  maxAttempts: number;
  retryDelay: RetryDelay;
  minPollMs: number;
  maxPollMs: number;
  groupOnDead: GroupOnDead;
  groupBatchSize: number;
  /** The queue's flow limits, or null for none (the claim then takes no flow lock). */
  limits: FlowLimits | null;
  transactional: boolean;
}

export interface ResolvedConsumerOptions {
  enabled: boolean;
  shutdownTimeoutMs: number;
  minPollMs: number;
  maxPollMs: number;
  workerId: string | null;
}

export interface ResolvedReaperOptions {
  enabled: boolean;
  intervalMs: number;
  batchSize: number;
}

export interface ResolvedRetentionOptions {
  enabled: boolean;
  intervalMs: number;
  doneMs: number;
  deadMs: number | null;
  idempotencyKeyMs: number;
  batchSize: number;
}

/** Every per-queue option's name. */
export const QUEUE_OPTION_KEYS: readonly (keyof QueueOptions)[] = [
  'minReaders',
  'maxReaders',
  'batchSize',
  'prefetch',
  'leaseMs',
  'maxDurationMs',
  'maxAttempts',
  'backoff',
  'minPollMs',
  'maxPollMs',
  'groupOnDead',
  'groupBatchSize',
  'globalConcurrency',
  'concurrencyPerKey',
  'rateLimit',
  'rateLimitPerKey',
  'transactional',
];

/** The most starts a rate limit's window may hold: the claim keeps each one's time. */
export const RATE_LIMIT_MAX = 10_000;

function assertRateLimit(where: string, raw: unknown): RateLimit {
  const value = assertOptionGroup(where, raw as RateLimit | undefined, ['max', 'perMs']);
  if (value.max === undefined || value.perMs === undefined) {
    throw new SqlQueueConfigError(`${where} must give both max and perMs, e.g. { max: 100, perMs: 1000 }`);
  }
  return {
    max: assertInteger(`${where}.max`, value.max, 1, RATE_LIMIT_MAX),
    perMs: assertInteger(`${where}.perMs`, value.perMs, 1, DAY_MS),
  };
}

function perKeySlotsOnly(limits: FlowLimits): boolean {
  return limits.globalConcurrency === null && limits.rateLimit === null && limits.rateLimitPerKey === null;
}

/** The flow limits of validated options, or null when none is set. */
function flowLimitsOf(o: QueueOptions, where: string): FlowLimits | null {
  const limits: FlowLimits = {
    globalConcurrency: o.globalConcurrency ?? null,
    concurrencyPerKey: o.concurrencyPerKey ?? null,
    rateLimit: o.rateLimit === undefined ? null : assertRateLimit(`${where}.rateLimit`, o.rateLimit),
    rateLimitPerKey:
      o.rateLimitPerKey === undefined ? null : assertRateLimit(`${where}.rateLimitPerKey`, o.rateLimitPerKey),
  };
  return Object.values(limits).every((value) => value === null) ? null : limits;
}

export function resolveConsumerOptions(raw: ConsumerOptions | undefined): ResolvedConsumerOptions {
  const where = 'consumer';
  for (const removed of ['activationIntervalMs', 'activationQuietMs']) {
    if (raw && typeof raw === 'object' && removed in raw) {
      throw new SqlQueueConfigError(
        `${where}.${removed} is no longer an option: readers now start for claimed work at once (up to maxReaders) and retire after empty claims; delete the option`,
      );
    }
  }
  const value = assertOptionGroup(where, raw, ['enabled', 'shutdownTimeoutMs', 'minPollMs', 'maxPollMs', 'workerId']);
  const minPollMs = assertInteger(`${where}.minPollMs`, value.minPollMs ?? 50, 1, 60_000);
  const maxPollMs = assertInteger(
    `${where}.maxPollMs`,
    value.maxPollMs ?? Math.max(2_000, minPollMs),
    minPollMs,
    300_000,
  );
  if (value.workerId !== undefined && (typeof value.workerId !== 'string' || !/^.{1,200}$/.test(value.workerId))) {
    throw new SqlQueueConfigError(`${where}.workerId must be a string of 1 to 200 characters`);
  }
  return {
    enabled: assertBoolean(`${where}.enabled`, value.enabled ?? true),
    shutdownTimeoutMs: assertInteger(`${where}.shutdownTimeoutMs`, value.shutdownTimeoutMs ?? 10_000, 0, 3_600_000),
    minPollMs,
    maxPollMs,
    workerId: value.workerId ?? null,
  };
}

export function resolveReaperOptions(raw: ReaperOptions | undefined): ResolvedReaperOptions {
  const value = assertOptionGroup('reaper', raw, ['enabled', 'intervalMs', 'batchSize']);
  return {
    enabled: assertBoolean('reaper.enabled', value.enabled ?? true),
    intervalMs: assertInteger('reaper.intervalMs', value.intervalMs ?? 5_000, 10, 3_600_000),
    batchSize: assertInteger('reaper.batchSize', value.batchSize ?? 500, 1, 10_000),
  };
}

export function resolveRetentionOptions(raw: RetentionOptions | undefined): ResolvedRetentionOptions {
  const where = 'retention';
  const value = assertOptionGroup(where, raw, [
    'enabled',
    'intervalMs',
    'doneMs',
    'deadMs',
    'idempotencyKeyMs',
    'batchSize',
  ]);
  const max = MAX_AGE_MS;
  return {
    enabled: assertBoolean(`${where}.enabled`, value.enabled ?? true),
    intervalMs: assertInteger(`${where}.intervalMs`, value.intervalMs ?? 60_000, 100, DAY_MS),
    doneMs: assertInteger(`${where}.doneMs`, value.doneMs ?? 7 * DAY_MS, 0, max),
    deadMs:
      value.deadMs === null || value.deadMs === undefined
        ? null
        : assertInteger(`${where}.deadMs`, value.deadMs, 0, max),
    idempotencyKeyMs: assertInteger(`${where}.idempotencyKeyMs`, value.idempotencyKeyMs ?? 7 * DAY_MS, 0, max),
    batchSize: assertInteger(`${where}.batchSize`, value.batchSize ?? 1_000, 1, 100_000),
  };
}

/** Checks one set of queue options (from the module map or a handler decorator). */
export function validateQueueOptions(where: string, raw: unknown): QueueOptions {
  const o = assertOptionGroup(where, raw as QueueOptions | undefined, QUEUE_OPTION_KEYS);
  const check = (key: keyof QueueOptions, min: number, max: number) => {
    if (o[key] !== undefined) assertInteger(`${where}.${key}`, o[key], min, max);
  };
  check('minReaders', 1, 1_000);
  check('maxReaders', 1, 1_000);
  check('batchSize', 1, 1_000);
  const prefetch: unknown = o.prefetch;
  if (
    prefetch !== undefined &&
    prefetch !== 'auto' &&
    !(Number.isInteger(prefetch) && (prefetch as number) >= 0 && (prefetch as number) <= 10_000)
  ) {
    throw new SqlQueueConfigError(
      `${where}.prefetch must be 'auto' or an integer from 0 to 10000, got ${describe(prefetch)}`,
    );
  }
  check('leaseMs', 100, INT_MAX);
  check('maxAttempts', 1, MAX_ATTEMPTS_LIMIT);
  check('minPollMs', 1, 60_000);
  check('maxPollMs', 1, 300_000);
  check('groupBatchSize', 1, 1_000);
  check('globalConcurrency', 1, 100_000);
  check('concurrencyPerKey', 1, 100_000);
  flowLimitsOf(o, where);
  if (o.transactional !== undefined) assertBoolean(`${where}.transactional`, o.transactional);
  if (o.groupOnDead !== undefined && o.groupOnDead !== 'continue' && o.groupOnDead !== 'block') {
    throw new SqlQueueConfigError(`${where}.groupOnDead must be 'continue' or 'block', got ${describe(o.groupOnDead)}`);
  }
  if (o.maxDurationMs !== undefined && o.maxDurationMs !== null)
    assertInteger(`${where}.maxDurationMs`, o.maxDurationMs, 1, INT_MAX);
  if (o.backoff !== undefined) retryDelayFor(o.backoff, where);
  return o;
}

/**
 * Effective options of a queue: handler decorator over the module's `queues` entry over the
 * consumer defaults over built-in defaults. Throws with the place that is wrong.
 */
export function resolveQueueOptions(
  queue: string,
  layers: { module?: QueueOptions; handler?: QueueOptions },
  consumer: ResolvedConsumerOptions,
  where = `queue '${queue}'`,
): ResolvedQueueOptions {
  assertQueueName(queue, SqlQueueConfigError);
  const merged: QueueOptions = { ...layers.module, ...layers.handler };
  validateQueueOptions(where, merged);
  const minReaders = merged.minReaders ?? 1;
  const maxReaders = merged.maxReaders ?? Math.max(5, minReaders);
  if (minReaders > maxReaders) {
    throw new SqlQueueConfigError(`${where}: minReaders (${minReaders}) is greater than maxReaders (${maxReaders})`);
  }
  const minPollMs = merged.minPollMs ?? consumer.minPollMs;
  const maxPollMs = merged.maxPollMs ?? Math.max(consumer.maxPollMs, minPollMs);
  if (minPollMs > maxPollMs) {
    throw new SqlQueueConfigError(`${where}: minPollMs (${minPollMs}) is greater than maxPollMs (${maxPollMs})`);
  }
  const limits = flowLimitsOf(merged, where);
  if (limits && (merged.groupBatchSize ?? 1) > 1) {
    throw new SqlQueueConfigError(
      `${where}: groupBatchSize cannot be combined with flow limits (a batch would start several jobs as one)`,
    );
  }
  const leaseMs = merged.leaseMs ?? 30_000;
  const maxDurationMs = merged.maxDurationMs === undefined ? 3_600_000 : merged.maxDurationMs;
  return {
    queue,
    minReaders,
    maxReaders,
    batchSize: merged.batchSize ?? DEFAULT_BATCH_SIZE,
    // A prefetched job is leased, and a start is counted at the lease: under a queue-wide limit
    // or a rate it would use the queue's slots (or starts) while it waits in memory, so such
    // queues claim for free readers only unless told otherwise. Under concurrencyPerKey alone it
    // holds only its own key's slot, which keeps the limit (conservatively) and the pace.
    prefetch: merged.prefetch ?? (limits && !perKeySlotsOnly(limits) ? 0 : 'auto'),
    leaseMs,
    maxDurationMs,
    maxAttempts: merged.maxAttempts ?? DEFAULT_MAX_ATTEMPTS,
    retryDelay: retryDelayFor(merged.backoff, where),
    minPollMs,
    maxPollMs,
    groupOnDead: merged.groupOnDead ?? 'continue',
    groupBatchSize: merged.groupBatchSize ?? 1,
    limits,
    transactional: merged.transactional ?? false,
  };
}

/** Validates the module's `queues` map: names and each entry. */
export function validateQueueMap(raw: unknown): Record<string, QueueOptions> {
  const map = assertOptionGroup('queues', raw as Record<string, unknown> | undefined);
  for (const [queue, options] of Object.entries(map)) {
    assertQueueName(queue, SqlQueueConfigError);
    validateQueueOptions(`queues['${queue}']`, options);
  }
  return map as Record<string, QueueOptions>;
}
