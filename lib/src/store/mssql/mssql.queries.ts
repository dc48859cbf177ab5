import {
  cancelAck,
  claim,
  complete,
  completeInTransaction,
  fail,
  hasClaimableWork,
  heartbeat,
  postpone,
  release,
} from './queries/claim.queries.js';
import {
  enqueueMany,
  enqueueManyGrouped,
  enqueueOne,
  enqueueOneGrouped,
  recordQueueSetting,
} from './queries/enqueue.queries.js';
import { cleanupFlowState, flowClaim, flowUsage } from './queries/flow.queries.js';
import { findGroupProblems, listBlockedGroups, repairGroup } from './queries/groups.queries.js';
import { scaleInputs } from './queries/scaling.queries.js';
import { ping, queueHealth, readThroughput, recordThroughput, stats } from './queries/health.queries.js';
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
import {
  cleanup,
  cleanupThroughput,
  purgeDead,
  purgeDeadIds,
  reap,
  retryAllDead,
  retryDead,
} from './queries/maintenance.queries.js';
import {
  scheduleAdvance,
  scheduleDelete,
  scheduleDueIn,
  scheduleGet,
  scheduleList,
  scheduleLockDue,
  schedulePause,
  scheduleUpsert,
} from './queries/schedules.queries.js';
import { cancel, findJobByKey, listPausedQueues, pauseQueue, resumeQueue } from './queries/control.queries.js';
import { mssqlTables, type MssqlTables } from './queries/tables.js';

// The dialect's statements by capability live in queries/; this file is their index.
export { mssqlEnqueueInTransaction } from './queries/enqueue.queries.js';
export { CLAIMABLE_GROUP, UNFINISHED_GROUPED, WAITING_GROUP } from './queries/groups.queries.js';
export { DEAD_JOB, DELAYED_UNGROUPED, DONE_KEYED, DONE_KEYLESS, LEASED_JOB } from './queries/listings.queries.js';
export { MSSQL_FLOW_ROW_MISSING } from './queries/flow.queries.js';
export { READY_KEYED, READY_UNKEYED } from './queries/shared.js';
export { UNPAUSED_SCHEDULE } from './queries/schedules.queries.js';
export {
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_CALLER_TRANSACTION_GONE,
  MSSQL_NESTED_OWN_TRANSACTION,
  MSSQL_NO_STORE_TRANSACTION,
  MSSQL_OPEN_TRANSACTION,
  MSSQL_OWN_TRANSACTION_GUARD,
  MSSQL_STORE_SESSION,
  MSSQL_STORE_TRANSACTION_SESSION,
} from './queries/session.js';
export { MSSQL_TABLE_TYPES } from './queries/tables.js';

/**
 * T-SQL statements, one function each, named by what they do. Values are always parameters
 * (@name); the only text spliced in is the schema name, validated at boot and bracket-quoted.
 * Batches of jobs travel as table-valued parameters of the types created by the migrations.
 *
 * Times come from the database clock (SYSUTCDATETIME()). Millisecond offsets that may exceed
 * the int range of DATEADD are applied as seconds plus a millisecond remainder.
 *
 * Every statement here is parsed by a T-SQL grammar in the test suite.
 */
export type MssqlQueries = { readonly [Name in keyof typeof STATEMENTS]: string };

const STATEMENTS = {
  pauseQueue,
  resumeQueue,
  listPausedQueues,
  cancel,
  cancelAck,
  findJobByKey,
  enqueueOne,
  enqueueOneGrouped,
  enqueueMany,
  enqueueManyGrouped,
  recordQueueSetting,
  claim,
  flowClaim,
  flowUsage,
  cleanupFlowState,
  heartbeat,
  complete,
  completeInTransaction,
  fail,
  release,
  postpone,
  reap,
  hasClaimableWork,
  stats,
  getJob,
  getJobAfterWriters,
  getAttempts,
  listDead,
  retryDead,
  retryAllDead,
  purgeDead,
  purgeDeadIds,
  cleanup,
  listReadyJobs,
  listDelayedJobs,
  listLeasedJobs,
  listDoneJobs,
  listDeadJobs,
  recordThroughput,
  readThroughput,
  cleanupThroughput,
  listBlockedGroups,
  findGroupProblems,
  repairGroup,
  ping,
  queueHealth,
  scaleInputs,
  scheduleDueIn,
  scheduleLockDue,
  scheduleAdvance,
  scheduleUpsert,
  scheduleGet,
  scheduleList,
  scheduleDelete,
  schedulePause,
} satisfies Record<string, (t: MssqlTables) => string>;

/** Every statement of the store for `schema`, built once per store. */
export function mssqlQueries(schema: string): MssqlQueries {
  const t = mssqlTables(schema);
  return Object.fromEntries(
    Object.entries(STATEMENTS).map(([name, statement]) => [name, statement(t)]),
  ) as MssqlQueries;
}
