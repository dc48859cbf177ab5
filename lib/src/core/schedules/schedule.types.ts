import type { NewJob } from '../types.js';

/**
 * What happens to the ticks a schedule missed while no instance ran: `none` skips them, `last`
 * runs one job for the missed period (the latest missed tick), `all` runs one per missed tick
 * (at most 1,000, with a warning).
 */
export type ScheduleCatchUp = 'none' | 'last' | 'all';

/** Options of the jobs a schedule enqueues (a tick's idempotency key and run time are the schedule's). */
export interface ScheduleJobOptions {
  priority?: number;
  maxAttempts?: number;
  groupKey?: string;
}

/** A recurring job, as the module option `schedules[id]` and `QueueProducer.schedule(id, …)` take it. */
export interface ScheduleDefinition {
  /** Cron expression: 5 fields (minute first) or 6 (seconds first), as the `cron` package reads them. */
  cron: string;
  /** IANA time zone the expression is read in (default 'UTC'). */
  timezone?: string;
  /** The queue each tick enqueues into. */
  queue: string;
  /** The payload of each tick's job (JSON; default null). */
  payload?: unknown;
  options?: ScheduleJobOptions;
  /** Default 'last'. */
  catchUp?: ScheduleCatchUp;
}

/** Where a schedule was defined: the module's `schedules` option (pruned with it) or the API. */
export type ScheduleSource = 'options' | 'api';

/** A schedule as listSchedules() returns it. */
export interface ScheduleRecord {
  id: string;
  queue: string;
  cron: string;
  timezone: string;
  payload: unknown;
  options: ScheduleJobOptions;
  catchUp: ScheduleCatchUp;
  paused: boolean;
  source: ScheduleSource;
  /** The next tick to fire (database time); null when the expression has no later tick. */
  nextRunAt: Date | null;
  /** When the last tick fired (database time), and which tick it was. */
  lastRunAt: Date | null;
  lastTick: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

/** What a job knows of the schedule tick that enqueued it (`JobContext.schedule`). */
export interface ScheduleTick {
  id: string;
  tick: Date;
}

// ---- Store-facing shapes: validated and serialized by core, stored by a dialect.

/** One schedule to insert or update. */
export interface ScheduleUpsert {
  id: string;
  queue: string;
  cron: string;
  timezone: string;
  /** JSON text. */
  payload: string;
  /** JSON text of ScheduleJobOptions. */
  options: string;
  catchUp: ScheduleCatchUp;
  source: ScheduleSource;
  /**
   * The first tick after the database's now, computed by core. The store writes it for a new
   * schedule and for one whose cron or timezone changed; an unchanged timing keeps its own.
   */
  nextRunAt: Date | null;
}

/** A schedule row as the store reads it: a record whose payload and options are still JSON text. */
export interface ScheduleRow extends Omit<ScheduleRecord, 'payload' | 'options'> {
  payload: string;
  options: string;
}

/** What firing one due schedule does, decided by core from the locked row and the database's now. */
export interface ScheduleFiring {
  id: string;
  /** The ticks' jobs (each keyed `schedule:<id>:<tick ISO>`); empty when every missed tick is skipped. */
  jobs: NewJob[];
  /** The next tick after now (null: none). */
  nextRunAt: Date | null;
  /** The latest tick handled (fired or skipped), recorded as the last tick when a job fired. */
  lastTick: Date | null;
}

/** The store side of recurring jobs. Every time is the database's. */
export interface ScheduleStore {
  /** The database's clock, and how long until the earliest unpaused schedule is due (null: none). One statement. */
  scheduleDueIn(): Promise<{ now: Date; dueInMs: number | null }>;

  /**
   * One transaction: locks up to `limit` due, unpaused schedules that no other instance holds
   * (FOR UPDATE SKIP LOCKED / UPDLOCK, READPAST, READCOMMITTEDLOCK), asks `plan` what to fire
   * (given the rows and the database's now), enqueues the jobs and advances each schedule, then
   * commits. A schedule another instance fires meanwhile is skipped, never fired twice.
   * Returns the firings committed.
   */
  fireDueSchedules(
    limit: number,
    plan: (rows: readonly ScheduleRow[], now: Date) => ScheduleFiring[],
  ): Promise<ScheduleFiring[]>;

  /**
   * Inserts or updates schedules by id; safe from many processes at once (one row per id). With
   * `pruneSource`, deletes the schedules of that source whose id is not in `items`.
   */
  upsertSchedules(items: readonly ScheduleUpsert[], pruneSource?: ScheduleSource): Promise<void>;

  getSchedule(id: string): Promise<ScheduleRow | null>;
  listSchedules(): Promise<ScheduleRow[]>;
  /** Returns whether it existed. */
  deleteSchedule(id: string): Promise<boolean>;
  /**
   * Pauses, or resumes with `nextRunAt` (the next tick after now, computed by core: a resumed
   * schedule does not catch up the paused period). Returns whether it existed.
   */
  setSchedulePaused(id: string, paused: boolean, nextRunAt: Date | null): Promise<boolean>;
}
