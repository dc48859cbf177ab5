import type {
  FlowKeyUsage,
  FlowLimits,
  FlowUsage,
  JobState,
  JobSummary,
  NewJob,
  QueueHealth,
  QueueStats,
} from '../core/types.js';
import type { ScheduleRow, ScheduleSource } from '../core/schedules/index.js';
import type { ScaleInputs } from '../core/scaling/index.js';

/**
 * Between our records and a dialect's rows, in both directions. The two dialects return the same
 * columns spelled their own way (SQL Server `GroupKey`, PostgreSQL `group_key`); the mapping is
 * written once here over our field names, and each store passes its spelling.
 */
const FIELDS = [
  'id',
  'queue',
  'state',
  'priority',
  'runAt',
  'groupKey',
  'idempotencyKey',
  'attempts',
  'maxAttempts',
  'leaseUntil',
  'workerId',
  'createdAt',
  'claimedAt',
  'finishedAt',
  'ready',
  'delayed',
  'leased',
  'expiredLeases',
  'dead',
  'retrying',
  'blockedGroups',
  'oldestReadyAgeMs',
  'recentFailures',
  'recentLeaseExpiries',
  'repeatedlyFailing',
  'cron',
  'timezone',
  'payload',
  'options',
  'catchUp',
  'paused',
  'source',
  'nextRunAt',
  'lastRunAt',
  'lastTick',
  'updatedAt',
  'globalConcurrency',
  'concurrencyPerKey',
  'rateMax',
  'ratePerMs',
  'keyRateMax',
  'keyRatePerMs',
  'running',
  'windowStarts',
  'keysAtLimit',
  'keys',
  'claimable',
  'completedInWindow',
  'busyMsInWindow',
  'windowMs',
] as const;

/** A dialect's column name for each field a mapping reads, computed once per store. */
export type Columns = Readonly<Record<(typeof FIELDS)[number], string>>;

type Row = Record<string, unknown>;

export function pascalCaseColumns(): Columns {
  return columnsSpelled((field) => field[0]!.toUpperCase() + field.slice(1));
}

export function snakeCaseColumns(): Columns {
  return columnsSpelled((field) => field.replace(/[A-Z]/g, (letter) => `_${letter.toLowerCase()}`));
}

function columnsSpelled(spell: (field: string) => string): Columns {
  return Object.fromEntries(FIELDS.map((field) => [field, spell(field)])) as Columns;
}

/** Counts come back as bigint from both drivers (as strings), so each goes through Number. */
export function toQueueStats(queue: string, row: Row, c: Columns): QueueStats {
  return {
    queue,
    ready: Number(row[c.ready]),
    delayed: Number(row[c.delayed]),
    leased: Number(row[c.leased]),
    expiredLeases: Number(row[c.expiredLeases]),
    dead: Number(row[c.dead]),
    retrying: Number(row[c.retrying]),
    blockedGroups: Number(row[c.blockedGroups] ?? 0),
    oldestReadyAgeMs: Math.max(0, Number(row[c.oldestReadyAgeMs] ?? 0)),
    paused: row[c.paused] === true || row[c.paused] === 1,
  };
}

/** A queue's flow usage (flowUsage statements); `keys` is a JSON array, or its text (SQL Server), or null. */
export function toFlowUsage(queue: string, row: Row | undefined, c: Columns): FlowUsage {
  const count = (value: unknown) => (value === null || value === undefined ? null : Number(value));
  const rate = (max: unknown, perMs: unknown) =>
    max === null || max === undefined ? null : { max: Number(max), perMs: Number(perMs) };
  const limits: FlowLimits = {
    globalConcurrency: count(row?.[c.globalConcurrency]),
    concurrencyPerKey: count(row?.[c.concurrencyPerKey]),
    rateLimit: rate(row?.[c.rateMax], row?.[c.ratePerMs]),
    rateLimitPerKey: rate(row?.[c.keyRateMax], row?.[c.keyRatePerMs]),
  };
  const keys = row?.[c.keys];
  return {
    queue,
    limits: Object.values(limits).every((value) => value === null) ? null : limits,
    running: Number(row?.[c.running] ?? 0),
    windowStarts: count(row?.[c.windowStarts]),
    keysAtLimit: count(row?.[c.keysAtLimit]),
    keys: typeof keys === 'string' ? (JSON.parse(keys) as FlowKeyUsage[]) : ((keys as FlowKeyUsage[] | null) ?? []),
  };
}

/** A queue's scale inputs (scaleInputs statements). */
export function toScaleInputs(row: Row, c: Columns): ScaleInputs {
  const count = (value: unknown) => (value === null || value === undefined ? null : Number(value));
  return {
    claimable: Number(row[c.claimable]),
    running: Number(row[c.running]),
    completedInWindow: Number(row[c.completedInWindow]),
    busyMsInWindow: Number(row[c.busyMsInWindow]),
    windowMs: Number(row[c.windowMs]),
    paused: row[c.paused] === true || row[c.paused] === 1,
    globalConcurrency: count(row[c.globalConcurrency]),
    rateMax: count(row[c.rateMax]),
    ratePerMs: count(row[c.ratePerMs]),
  };
}

export function toQueueHealth(row: Row, c: Columns): QueueHealth {
  return {
    ...toQueueStats(row[c.queue] as string, row, c),
    recentFailures: Number(row[c.recentFailures]),
    recentLeaseExpiries: Number(row[c.recentLeaseExpiries]),
    repeatedlyFailing: Number(row[c.repeatedlyFailing]),
  };
}

export function toScheduleRow(row: Row, c: Columns): ScheduleRow {
  return {
    id: row[c.id] as string,
    queue: row[c.queue] as string,
    cron: row[c.cron] as string,
    timezone: row[c.timezone] as string,
    payload: row[c.payload] as string,
    options: row[c.options] as string,
    catchUp: row[c.catchUp] as ScheduleRow['catchUp'],
    paused: Boolean(row[c.paused]),
    source: row[c.source] as ScheduleSource,
    nextRunAt: (row[c.nextRunAt] as Date | null) ?? null,
    lastRunAt: (row[c.lastRunAt] as Date | null) ?? null,
    lastTick: (row[c.lastTick] as Date | null) ?? null,
    createdAt: row[c.createdAt] as Date,
    updatedAt: row[c.updatedAt] as Date,
  };
}

/** What a job record and a listed job both carry. */
export function jobFields(row: Row, c: Columns): Omit<JobSummary, 'payloadPreview' | 'lastErrorPreview'> {
  return {
    id: row[c.id] as string,
    queue: row[c.queue] as string,
    state: row[c.state] as JobState,
    priority: Number(row[c.priority]),
    runAt: row[c.runAt] as Date,
    groupKey: (row[c.groupKey] as string | null) ?? null,
    idempotencyKey: (row[c.idempotencyKey] as string | null) ?? null,
    attempts: Number(row[c.attempts]),
    maxAttempts: Number(row[c.maxAttempts]),
    leaseUntil: (row[c.leaseUntil] as Date | null) ?? null,
    workerId: (row[c.workerId] as string | null) ?? null,
    createdAt: row[c.createdAt] as Date,
    claimedAt: (row[c.claimedAt] as Date | null) ?? null,
    finishedAt: (row[c.finishedAt] as Date | null) ?? null,
  };
}

/**
 * A new job's values in the order both dialects' enqueue statements take them (SQL Server's
 * table-valued parameter after its ordinal, PostgreSQL's $1..$10).
 */
export function newJobValues(job: NewJob): (string | number | Date | null)[] {
  return [
    job.queue,
    job.payload,
    job.priority,
    job.runAt,
    job.delayMs,
    job.groupKey,
    job.idempotencyKey,
    job.maxAttempts,
    job.defaultMaxAttempts,
    job.traceContext ?? null,
  ];
}
