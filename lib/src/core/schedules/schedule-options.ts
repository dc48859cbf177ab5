import { SqlQueueValidationError } from '../errors.js';
import type { EnqueueOptions } from '../types.js';
import { assertOptionGroup, assertQueueName, DEFAULT_MAX_ATTEMPTS, describe } from '../validation.js';
import { prepareJob, SCHEDULE_KEY_PREFIX } from '../producer/index.js';
import { assertCron, DEFAULT_SCHEDULE_TIMEZONE, nextTick } from './schedule-cron.js';
import type {
  ScheduleCatchUp,
  ScheduleDefinition,
  ScheduleJobOptions,
  ScheduleRecord,
  ScheduleRow,
  ScheduleSource,
  ScheduleTick,
  ScheduleUpsert,
} from './schedule.types.js';

type ErrorClass = new (message: string) => Error;

/** Letters, digits, '.', '-', '_', 1 to 128 characters: the same in both dialects' key columns. */
const SCHEDULE_ID = /^[A-Za-z0-9._-]{1,128}$/;

/** Missed ticks run one job for the missed period unless a schedule says otherwise (as Hangfire does). */
export const DEFAULT_SCHEDULE_CATCH_UP: ScheduleCatchUp = 'last';

/** Every key a definition takes; a compile error reminds whoever adds one to ScheduleDefinition. */
const DEFINITION_KEYS: Record<keyof ScheduleDefinition, true> = {
  cron: true,
  timezone: true,
  queue: true,
  payload: true,
  options: true,
  catchUp: true,
};
export const SCHEDULE_DEFINITION_KEYS = Object.keys(DEFINITION_KEYS) as readonly (keyof ScheduleDefinition)[];

const JOB_OPTION_KEYS: Record<keyof ScheduleJobOptions, true> = { priority: true, maxAttempts: true, groupKey: true };
export const SCHEDULE_JOB_OPTION_KEYS = Object.keys(JOB_OPTION_KEYS) as readonly (keyof ScheduleJobOptions)[];

const CATCH_UP: readonly ScheduleCatchUp[] = ['none', 'last', 'all'];

/** A schedule id, or throws naming it and the rule. */
export function assertScheduleId(id: unknown, error: ErrorClass = SqlQueueValidationError): string {
  if (typeof id !== 'string' || !SCHEDULE_ID.test(id)) {
    throw new error(`schedule id ${describe(id)} is invalid: use letters, digits, '.', '-', '_' (1 to 128 characters)`);
  }
  return id;
}

/** A definition checked and made store-ready (JSON as text, defaults filled in). */
export interface ValidScheduleDefinition {
  cron: string;
  timezone: string;
  queue: string;
  /** JSON text. */
  payload: string;
  options: ScheduleJobOptions;
  catchUp: ScheduleCatchUp;
}

/**
 * Checks a schedule's id and definition (cron and zone, queue name, payload as the enqueue path
 * checks it, job options as enqueue's, catchUp), or throws naming the schedule and the problem;
 * a misspelt key gets the nearest valid name. `error` is SqlQueueConfigError for the module's
 * `schedules` option (raised at boot), SqlQueueValidationError for an API call.
 */
export function validateScheduleDefinition(
  id: unknown,
  definition: ScheduleDefinition,
  maxPayloadBytes: number,
  error: ErrorClass = SqlQueueValidationError,
): ValidScheduleDefinition {
  const where = `schedule '${assertScheduleId(id, error)}'`;
  if (definition === undefined) throw new error(`${where}: give a definition { cron, queue, … }`);
  const def = assertOptionGroup(where, definition, SCHEDULE_DEFINITION_KEYS, error);
  const timezone = def.timezone ?? DEFAULT_SCHEDULE_TIMEZONE;
  assertCron(where, def.cron, timezone, error);
  if (def.queue === undefined) throw new error(`${where}: queue is required (the queue each tick enqueues into)`);
  const queue = asError(error, () => assertQueueName(def.queue), `${where}: `);
  const given = assertOptionGroup(`${where}: options`, def.options, SCHEDULE_JOB_OPTION_KEYS, error);
  const catchUp = def.catchUp ?? DEFAULT_SCHEDULE_CATCH_UP;
  if (!CATCH_UP.includes(catchUp)) {
    throw new error(`${where}: catchUp must be 'none', 'last' or 'all', got ${describe(catchUp)}`);
  }
  // The enqueue path's own checks, so a tick's job is refused here rather than when it fires.
  const job = asError(error, () =>
    prepareJob(
      queue,
      def.payload ?? null,
      { priority: given.priority, maxAttempts: given.maxAttempts, groupKey: given.groupKey } satisfies EnqueueOptions,
      { maxPayloadBytes, defaultMaxAttempts: DEFAULT_MAX_ATTEMPTS },
      where,
    ),
  );
  const options: ScheduleJobOptions = {};
  if (given.priority !== undefined) options.priority = job.priority;
  if (given.maxAttempts !== undefined) options.maxAttempts = job.maxAttempts!;
  if (job.groupKey !== null) options.groupKey = job.groupKey;
  return { cron: def.cron, timezone, queue, payload: job.payload, options, catchUp };
}

/** What the store upserts for a schedule: validated, serialized, and its first tick after `now` (database time). */
export function toScheduleUpsert(
  id: string,
  definition: ScheduleDefinition,
  source: ScheduleSource,
  now: Date,
  maxPayloadBytes: number,
  error: ErrorClass = SqlQueueValidationError,
): ScheduleUpsert {
  return scheduleUpsertOf(id, validateScheduleDefinition(id, definition, maxPayloadBytes, error), source, now);
}

/** The upsert of a definition already validated, with its first tick after `now` (database time). */
export function scheduleUpsertOf(
  id: string,
  valid: ValidScheduleDefinition,
  source: ScheduleSource,
  now: Date,
): ScheduleUpsert {
  return {
    id,
    queue: valid.queue,
    cron: valid.cron,
    timezone: valid.timezone,
    payload: valid.payload,
    options: JSON.stringify(valid.options),
    catchUp: valid.catchUp,
    source,
    nextRunAt: nextTick(valid.cron, valid.timezone, now),
  };
}

/** A stored row as listSchedules() returns it (JSON parsed). */
export function toScheduleRecord(row: ScheduleRow): ScheduleRecord {
  return {
    id: row.id,
    queue: row.queue,
    cron: row.cron,
    timezone: row.timezone,
    payload: JSON.parse(row.payload) as unknown,
    options: JSON.parse(row.options) as ScheduleJobOptions,
    catchUp: row.catchUp,
    paused: row.paused,
    source: row.source,
    nextRunAt: row.nextRunAt,
    lastRunAt: row.lastRunAt,
    lastTick: row.lastTick,
    createdAt: row.createdAt,
    updatedAt: row.updatedAt,
  };
}

const JOB_KEY = /^schedule:([A-Za-z0-9._-]{1,128}):(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z)$/;

/**
 * The idempotency key of a tick's job, `schedule:<id>:<tick ISO 8601 UTC with ms>`
 * (schedule:report.daily:2026-12-01T02:30:00.000Z): a second guard against firing a tick twice.
 */
export function scheduleJobKey(id: string, tick: Date): string {
  return `${SCHEDULE_KEY_PREFIX}${id}:${tick.toISOString()}`;
}

/** The schedule and tick a job's idempotency key names (`JobContext.schedule`), or null for any other key. */
export function parseScheduleJobKey(key: string | null | undefined): ScheduleTick | null {
  if (!key?.startsWith(SCHEDULE_KEY_PREFIX)) return null;
  const match = JOB_KEY.exec(key);
  if (!match) return null;
  const tick = new Date(match[2]!);
  // A well-formed but impossible date (2026-02-30…) is not a tick we wrote.
  if (Number.isNaN(tick.getTime()) || tick.toISOString() !== match[2]) return null;
  return { id: match[1]!, tick };
}

/** Runs the enqueue path's checks, whose refusals are validation errors, raising them as `error`. */
function asError<T>(error: ErrorClass, check: () => T, prefix = ''): T {
  try {
    return check();
  } catch (cause) {
    if (cause instanceof SqlQueueValidationError && (prefix || error !== SqlQueueValidationError)) {
      throw new error(`${prefix}${cause.message}`);
    }
    throw cause;
  }
}
