import { claim, complete, fail, hasClaimableWork, heartbeat, release } from './queries/claim.queries.js';
import {
  enqueueMany,
  enqueueManyUniform,
  enqueueOne,
  findByIdempotencyKeys,
  notify,
  recordQueueSettings,
} from './queries/enqueue.queries.js';
import {
  listBlockedGroups,
  releaseVoidHolds,
  repairApply,
  repairCheck,
  repairLock,
  repairOrphans,
  settleApply,
  settleLock,
  touchLock,
  touchMove,
} from './queries/groups.queries.js';
import { monitoringSettings, queueHealth, readThroughput, recordThroughput, stats } from './queries/health.queries.js';
import {
  getAttempts,
  getJob,
  getJobAfterWriters,
  listDead,
  listDeadJobs,
  listDelayedJobs,
  listDoneJobs,
  listLeasedJobs,
  listReadyJobs,
} from './queries/listings.queries.js';
import { cleanup, cleanupThroughput, purgeDead, reap, retryAllDead, retryDead } from './queries/maintenance.queries.js';
import {
  scheduleAdvance,
  scheduleDelete,
  scheduleDueIn,
  scheduleGet,
  scheduleList,
  scheduleLockDue,
  schedulePause,
  schedulePrune,
  scheduleUpsert,
} from './queries/schedules.queries.js';
import {
  cancel,
  cancelLockGroups,
  findJobByKey,
  listPausedQueues,
  pauseQueue,
  resumeQueue,
} from './queries/control.queries.js';
import {
  flowBudget,
  flowLease,
  flowLock,
  flowLockCreate,
  flowRecordStarts,
  flowUsage,
  cleanupFlowState,
} from './queries/flow.queries.js';
import { scaleInputs } from './queries/scaling.queries.js';
import { pgTables, type PgTables } from './queries/tables.js';

// The dialect's statements by capability live in queries/; this file is their index.

/**
 * PostgreSQL statements, one function each. Values are always bound parameters; the only
 * text spliced in is the schema name, validated at boot and quoted here.
 *
 * Batches travel in one round trip: as typed arrays expanded with unnest (bulk enqueue), or as
 * one json parameter expanded with json_array_elements (uniform bulk enqueue) or one jsonb
 * parameter expanded with jsonb_to_recordset; the same text for node-postgres and PGlite.
 *
 * Times come from the database clock (now()). In autocommit, now() is the statement's time; the
 * enqueue statements, which may run in a caller's transaction, use statement_timestamp(), so a
 * delay counts from the enqueue and not from the caller's BEGIN.
 */
export type PgQueries = { readonly [Name in keyof typeof STATEMENTS]: string };

const STATEMENTS = {
  pauseQueue,
  resumeQueue,
  listPausedQueues,
  cancelLockGroups,
  cancel,
  findJobByKey,
  enqueueOne,
  enqueueMany,
  enqueueManyUniform,
  recordQueueSettings,
  findByIdempotencyKeys,
  claim,
  flowLock,
  flowLockCreate,
  flowBudget,
  flowLease,
  flowRecordStarts,
  flowUsage,
  cleanupFlowState,
  heartbeat,
  complete,
  fail,
  release,
  reap,
  touchLock,
  touchMove,
  releaseVoidHolds,
  settleLock,
  settleApply,
  repairCheck,
  repairLock,
  repairApply,
  repairOrphans,
  listBlockedGroups,
  hasClaimableWork,
  stats,
  getJob,
  getJobAfterWriters,
  getAttempts,
  listDead,
  retryDead,
  retryAllDead,
  purgeDead,
  cleanup,
  listReadyJobs,
  listDelayedJobs,
  listLeasedJobs,
  listDoneJobs,
  listDeadJobs,
  recordThroughput,
  readThroughput,
  cleanupThroughput,
  notify,
  monitoringSettings,
  queueHealth,
  scaleInputs,
  scheduleDueIn,
  scheduleLockDue,
  scheduleAdvance,
  scheduleUpsert,
  schedulePrune,
  scheduleGet,
  scheduleList,
  scheduleDelete,
  schedulePause,
} satisfies Record<string, (t: PgTables) => string>;

/** Every statement of the store for `schema`, built once per store. */
export function pgQueries(schema: string): PgQueries {
  const t = pgTables(schema);
  return Object.fromEntries(Object.entries(STATEMENTS).map(([name, statement]) => [name, statement(t)])) as PgQueries;
}
