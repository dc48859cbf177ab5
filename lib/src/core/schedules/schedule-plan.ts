import type { NewJob } from '../types.js';
import { latestTick, latestTicks, nextTick, ticksBetween } from './schedule-cron.js';
import { scheduleJobKey } from './schedule-options.js';
import type { ScheduleFiring, ScheduleJobOptions, ScheduleRow } from './schedule.types.js';

/** The most missed ticks `catchUp: 'all'` fires at once (the latest ones; the bound). */
export const DEFAULT_MAX_CATCH_UP = 1_000;
/** With `catchUp: 'none'`, the latest missed tick still fires when it is at most this old. */
export const DEFAULT_CATCH_UP_GRACE_MS = 60_000;
/** A row that cannot be planned (its stored cron or JSON is broken) is tried again this much later. */
export const BROKEN_SCHEDULE_RETRY_MS = 3_600_000;

export interface PlanOptions {
  /** Default 1,000. Also how far missed ticks are counted (`skipped` is a lower bound beyond). */
  maxCatchUp?: number;
  /** Default 60 s. */
  graceMs?: number;
  /** This process's default maxAttempts for a queue (NewJob.defaultMaxAttempts). */
  defaultMaxAttemptsFor: (queue: string) => number;
  /** Told when missed ticks are dropped past the cap, or a row cannot be planned. */
  onWarning?: (message: string) => void;
}

/** A firing with what the scheduler reports of it (extra fields the store ignores). */
export interface PlannedFiring extends ScheduleFiring {
  queue: string;
  /**
   * Due ticks not fired: missed ones catchUp skips, or those dropped past the cap. Missed ticks
   * are counted up to maxCatchUp + 1, so past that it is a lower bound.
   */
  skipped: number;
  /** How far behind the schedule was: now minus its first unfired tick. */
  lagMs: number;
}

/**
 * What to fire for each locked, due schedule, given the database's now. A row's due ticks are
 * every tick t with nextRunAt <= t <= now (nextRunAt is its first unfired tick). One due tick
 * (the normal case) fires, however late. More than one (no instance ran for a while): `none`
 * fires only the latest, and only if it is within `graceMs` of now; `last` fires the latest;
 * `all` fires each, at most `maxCatchUp` (the latest), with a warning naming how many were
 * dropped. The next run is the schedule's next tick after now. Pure: no I/O, no clock.
 */
export function planFirings(rows: readonly ScheduleRow[], now: Date, options: PlanOptions): PlannedFiring[] {
  const firings: PlannedFiring[] = [];
  for (const row of rows) {
    if (row.paused || row.nextRunAt === null || row.nextRunAt.getTime() > now.getTime()) continue;
    try {
      firings.push(planRow(row, now, options));
    } catch (error) {
      // One broken row must not hold back every other schedule, nor be retried in a tight loop.
      options.onWarning?.(
        `schedule '${row.id}' (cron '${row.cron}', timezone '${row.timezone}') could not be planned and is tried again in an hour: ${(error as Error).message}; upsert it with a valid definition`,
      );
      firings.push({
        id: row.id,
        queue: row.queue,
        jobs: [],
        nextRunAt: new Date(now.getTime() + BROKEN_SCHEDULE_RETRY_MS),
        lastTick: null,
        skipped: 0,
        lagMs: now.getTime() - row.nextRunAt.getTime(),
      });
    }
  }
  return firings;
}

function planRow(row: ScheduleRow, now: Date, options: PlanOptions): PlannedFiring {
  const maxCatchUp = options.maxCatchUp ?? DEFAULT_MAX_CATCH_UP;
  const graceMs = options.graceMs ?? DEFAULT_CATCH_UP_GRACE_MS;
  const first = row.nextRunAt!;
  const jobOptions = JSON.parse(row.options) as ScheduleJobOptions;
  const firing = (fired: readonly Date[], latest: Date, nextRunAt: Date | null, skipped: number): PlannedFiring => ({
    id: row.id,
    queue: row.queue,
    jobs: fired.map((tick) => tickJob(row, jobOptions, tick, options)),
    nextRunAt,
    lastTick: latest,
    skipped,
    lagMs: now.getTime() - first.getTime(),
  });

  const second = nextTick(row.cron, row.timezone, first);
  if (second === null || second.getTime() > now.getTime()) {
    // One tick due: it fires however late, except under 'none', which runs no tick later than
    // the grace (no instance fired it in time: missed, whether or not a later tick is due yet).
    const missed = row.catchUp === 'none' && now.getTime() - first.getTime() > graceMs;
    return missed ? firing([], first, second, 1) : firing([first], first, second, 0);
  }

  // Missed ticks. Each next tick follows from the one before (not from now), so a wall-clock
  // time repeated by a DST fall-back is not fired twice.
  const latest = latestTick(row.cron, row.timezone, second, now)!;
  const nextRunAt = nextTick(row.cron, row.timezone, latest);
  const counted = ticksBetween(row.cron, row.timezone, first, now, maxCatchUp + 1);
  const more = counted.length > maxCatchUp;
  const due = counted.length;
  switch (row.catchUp) {
    case 'none': {
      const fire = now.getTime() - latest.getTime() <= graceMs ? [latest] : [];
      return firing(fire, latest, nextRunAt, due - fire.length);
    }
    case 'all': {
      if (!more) return firing(counted, latest, nextRunAt, 0);
      const fire = latestTicks(row.cron, row.timezone, first, now, maxCatchUp);
      const dropped = counted.filter((tick) => tick.getTime() < fire[0]!.getTime()).length;
      // Counting stopped at maxCatchUp + 1 ticks: exact only if it reached the first one fired.
      const exact = counted[counted.length - 1]!.getTime() >= fire[0]!.getTime();
      options.onWarning?.(
        `schedule '${row.id}' missed more than ${maxCatchUp} ticks from ${first.toISOString()} to ${latest.toISOString()}; catchUp 'all' fires the latest ${fire.length} (from ${fire[0]!.toISOString()}) and drops the ${exact ? '' : 'at least '}${dropped} before them`,
      );
      return firing(fire, latest, nextRunAt, dropped);
    }
    default:
      return firing([latest], latest, nextRunAt, due - 1);
  }
}

function tickJob(row: ScheduleRow, jobOptions: ScheduleJobOptions, tick: Date, options: PlanOptions): NewJob {
  return {
    queue: row.queue,
    payload: row.payload,
    priority: jobOptions.priority ?? 0,
    runAt: null,
    delayMs: 0,
    groupKey: jobOptions.groupKey ?? null,
    concurrencyKey: null,
    idempotencyKey: scheduleJobKey(row.id, tick),
    maxAttempts: jobOptions.maxAttempts ?? null,
    defaultMaxAttempts: options.defaultMaxAttemptsFor(row.queue),
  };
}

/** One tick's job of a schedule (a manual trigger's too): its queue, payload and options, keyed by the tick. */
export function scheduleTickJob(row: ScheduleRow, tick: Date, defaultMaxAttempts: number): NewJob {
  return tickJob(row, JSON.parse(row.options) as ScheduleJobOptions, tick, {
    defaultMaxAttemptsFor: () => defaultMaxAttempts,
  });
}
