// Recurring jobs, framework-free: what the Nest wiring and the stores use.
export * from './schedule.types.js';
export {
  assertCron,
  CRON_MAX_LENGTH,
  DEFAULT_SCHEDULE_TIMEZONE,
  latestTick,
  latestTicks,
  nextTick,
  ticksBetween,
  TIMEZONE_MAX_LENGTH,
} from './schedule-cron.js';
export {
  assertScheduleId,
  DEFAULT_SCHEDULE_CATCH_UP,
  parseScheduleJobKey,
  scheduleUpsertOf,
  SCHEDULE_DEFINITION_KEYS,
  SCHEDULE_JOB_OPTION_KEYS,
  scheduleJobKey,
  toScheduleRecord,
  toScheduleUpsert,
  validateScheduleDefinition,
  type ValidScheduleDefinition,
} from './schedule-options.js';
export {
  BROKEN_SCHEDULE_RETRY_MS,
  DEFAULT_CATCH_UP_GRACE_MS,
  DEFAULT_MAX_CATCH_UP,
  planFirings,
  type PlannedFiring,
  type PlanOptions,
} from './schedule-plan.js';
export { ScheduleAdmin } from './schedule-admin.js';
export { SqlQueueScheduler, type SqlQueueSchedulerDeps } from './scheduler.js';
