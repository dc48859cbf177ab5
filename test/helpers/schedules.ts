import { scheduleJobKey } from '../../lib/src/core/schedules/schedule-options.js';
import { scheduleTickJob } from '../../lib/src/core/schedules/schedule-plan.js';
import type { ScheduleFiring, ScheduleRow } from '../../lib/src/core/schedules/schedule.types.js';
import type { NewJob } from '../../lib/src/core/types.js';

// Recurring-job helpers of the store tests (both dialects): the jobs and firings a test's plan
// hands fireDueSchedules, built by core's own builders, as the scheduler builds them.

export const HOUR_MS = 3_600_000;

export const later = (at: Date, ms: number): Date => new Date(at.getTime() + ms);

/** A tick's job as the scheduler builds it: the row's queue, payload and options, keyed `schedule:<id>:<tick>`. */
export function tickJob(row: ScheduleRow, tick: Date, defaultMaxAttempts = 3): NewJob {
  return scheduleTickJob(row, tick, defaultMaxAttempts);
}

/** A job keyed as the tick of schedule `id` (which only the scheduler gives: an enqueue call may not). */
export function keyedAsTick(job: NewJob, id: string, tick: Date): NewJob {
  return { ...job, idempotencyKey: scheduleJobKey(id, tick) };
}

/** A plan that fires each due row's tick (its next run) and moves it an hour past the round's now. */
export function fireNextHour(rows: readonly ScheduleRow[], now: Date): ScheduleFiring[] {
  return rows.map((row) => ({
    id: row.id,
    jobs: [tickJob(row, row.nextRunAt!)],
    nextRunAt: later(now, HOUR_MS),
    lastTick: row.nextRunAt,
  }));
}
