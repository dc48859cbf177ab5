import { SqlQueueValidationError } from '../errors.js';
import type { QueueStore } from '../queue-store.js';
import { NO_TRACING, type QueueTracer } from '../tracing.js';
import type { EnqueueResult } from '../types.js';
import { withTraceContext } from '../producer/index.js';
import { nextTick } from './schedule-cron.js';
import {
  assertScheduleId,
  scheduleUpsertOf,
  toScheduleRecord,
  validateScheduleDefinition,
} from './schedule-options.js';
import { scheduleTickJob } from './schedule-plan.js';
import type { ScheduleDefinition, ScheduleRecord } from './schedule.types.js';

export interface ScheduleAdminDeps {
  store: Pick<
    QueueStore,
    | 'enqueue'
    | 'scheduleDueIn'
    | 'upsertSchedules'
    | 'getSchedule'
    | 'listSchedules'
    | 'deleteSchedule'
    | 'setSchedulePaused'
  >;
  maxPayloadBytes: number;
  defaultMaxAttemptsFor(queue: string): number;
  /** Why a queue cannot take a schedule's jobs (a message naming the fix), or null when it can. */
  checkQueue(id: string, queue: string): string | null;
  /** A schedule changed here: the scheduler should look again now rather than at its next poll. */
  changed(): void;
  /** A job was enqueued into `queue` (trigger): wake its readers, as an enqueue does. */
  enqueued(queue: string): void;
  /** A trigger's send span and the trace context its job stores, as an enqueue's (none when absent). */
  tracer?: QueueTracer;
}

/**
 * The programmatic side of recurring jobs, behind QueueProducer: every argument is checked
 * before the database is touched; times come from the database.
 */
export class ScheduleAdmin {
  constructor(private readonly deps: ScheduleAdminDeps) {}

  /**
   * Creates or updates a schedule (by id). A changed cron or time zone takes effect from the
   * next tick after now; other changes (payload, queue, options, catchUp) from the next firing.
   */
  async schedule(id: string, definition: ScheduleDefinition): Promise<ScheduleRecord> {
    const valid = validateScheduleDefinition(id, definition, this.deps.maxPayloadBytes);
    const problem = this.deps.checkQueue(id, valid.queue);
    if (problem) throw new SqlQueueValidationError(problem);
    const { now } = await this.deps.store.scheduleDueIn();
    await this.deps.store.upsertSchedules([scheduleUpsertOf(id, valid, 'api', now)]);
    this.deps.changed();
    return (await this.get(id))!;
  }

  /** Deletes a schedule; false when there was none. Jobs it enqueued stay. */
  async unschedule(id: string): Promise<boolean> {
    return this.deps.store.deleteSchedule(assertScheduleId(id));
  }

  async get(id: string): Promise<ScheduleRecord | null> {
    const row = await this.deps.store.getSchedule(assertScheduleId(id));
    return row ? toScheduleRecord(row) : null;
  }

  /** Every schedule, by id, with its next and last fire times. */
  async list(): Promise<ScheduleRecord[]> {
    return (await this.deps.store.listSchedules()).map(toScheduleRecord);
  }

  /** Stops a schedule's ticks until resume(); a tick firing right now may still enqueue. */
  async pause(id: string): Promise<void> {
    if (!(await this.deps.store.setSchedulePaused(assertScheduleId(id), true, null))) throw unknown(id);
  }

  /** Resumes a paused schedule from its next tick after now: the paused period is not caught up. */
  async resume(id: string): Promise<void> {
    const row = await this.deps.store.getSchedule(assertScheduleId(id));
    if (!row) throw unknown(id);
    const { now } = await this.deps.store.scheduleDueIn();
    await this.deps.store.setSchedulePaused(id, false, nextTick(row.cron, row.timezone, now));
    this.deps.changed();
  }

  /**
   * Enqueues one job of the schedule now (database time), outside its ticks: its payload and
   * options, keyed `schedule:<id>:<now>`, so the job's context names the schedule. A paused
   * schedule can be triggered; its ticks are left as they are.
   */
  async trigger(id: string): Promise<EnqueueResult & { tick: Date }> {
    const row = await this.deps.store.getSchedule(assertScheduleId(id));
    if (!row) throw unknown(id);
    const { now } = await this.deps.store.scheduleDueIn();
    // Cron ticks fall on whole seconds: a trigger at a whole second moves 1 ms on, so its key
    // (schedule:<id>:<time>) can never be a tick's, which would make one of the two a duplicate.
    const at = now.getUTCMilliseconds() === 0 ? new Date(now.getTime() + 1) : now;
    const job = scheduleTickJob(row, at, this.deps.defaultMaxAttemptsFor(row.queue));
    // A trigger is a call someone made (an admin request): its job joins that trace, as an
    // enqueue's does. Ticks fired by the scheduler carry none.
    const [result] = await (this.deps.tracer ?? NO_TRACING).send(row.queue, null, (traceContext) => {
      withTraceContext([job], traceContext);
      return this.deps.store.enqueue([job]);
    });
    this.deps.enqueued(row.queue);
    return { ...result!, tick: at };
  }
}

function unknown(id: string): SqlQueueValidationError {
  return new SqlQueueValidationError(`no schedule '${id}': see listSchedules() for the ids there are`);
}
