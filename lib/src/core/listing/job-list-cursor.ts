import { SqlQueueValidationError } from '../errors.js';
import type { JobId, JobListRequest, ListedJobState } from '../types.js';
import { assertJobId } from '../producer/index.js';
import { assertInteger, assertKeyText, assertQueueName, describe } from '../validation.js';

/** Most jobs one listing page returns. */
export const JOB_LIST_MAX_LIMIT = 500;

const STATES: readonly ListedJobState[] = ['ready', 'delayed', 'leased', 'done', 'dead'];

/** The name of each state's listing statement, the same in every dialect's queries. */
export const JOB_LIST_STATEMENTS = {
  ready: 'listReadyJobs',
  delayed: 'listDelayedJobs',
  leased: 'listLeasedJobs',
  done: 'listDoneJobs',
  dead: 'listDeadJobs',
} as const satisfies Record<ListedJobState, string>;

/**
 * Where a job listing stopped: the sort key of the last job listed, or of the last entry a
 * grouped look-up read (see JobListRequest), in its state's order. Times are UTC ISO 8601 text
 * at the database's own precision: a Date keeps milliseconds only, and jobs finished within one
 * millisecond would be repeated or skipped.
 */
export interface JobListPosition {
  /** Ready and delayed jobs are listed outside ordered groups first, then grouped ones. */
  part: 'ungrouped' | 'grouped';
  id: JobId;
  /** Ready, ungrouped part. */
  priority: number | null;
  /** Run time (ready and delayed, ungrouped part), lease end (leased), finish time (done). */
  time: string | null;
  /** Grouped part. */
  groupKey: string | null;
}

/** A listing request checked before any SQL runs, with its cursor decoded (null: first page). */
export interface CheckedJobListRequest {
  queue: string;
  state: ListedJobState;
  limit: number;
  after: JobListPosition | null;
}

/** What each state's position carries besides the id. */
function positionFields(state: ListedJobState, part: JobListPosition['part']): { priority: boolean; time: boolean } {
  if (part === 'grouped') return { priority: false, time: false };
  return { priority: state === 'ready', time: state !== 'dead' };
}

/** The cursor's JSON: short keys, since it travels in URLs. `v` lets a later format tell itself apart. */
interface CursorJson {
  v: 1;
  q: string;
  s: ListedJobState;
  p: 'u' | 'g';
  i: string;
  r?: number;
  t?: string;
  g?: string;
}

/**
 * The cursor of the page after `last`: opaque base64url text of a small JSON that names the
 * queue and state too, so a cursor passed to another listing is refused instead of paging it
 * from a meaningless position.
 */
export function encodeJobListCursor(request: { queue: string; state: ListedJobState }, last: JobListPosition): string {
  const json: CursorJson = {
    v: 1,
    q: request.queue,
    s: request.state,
    p: last.part === 'grouped' ? 'g' : 'u',
    i: last.id,
  };
  if (last.priority !== null) json.r = last.priority;
  if (last.time !== null) json.t = last.time;
  if (last.groupKey !== null) json.g = last.groupKey;
  return Buffer.from(JSON.stringify(json), 'utf8').toString('base64url');
}

/**
 * Validates a listing request for a store (the caller validates too; a store never trusts a
 * limit or a cursor it is handed). Throws SqlQueueValidationError naming the problem.
 */
export function checkJobListRequest(request: JobListRequest): CheckedJobListRequest {
  const queue = assertQueueName(request.queue);
  if (!STATES.includes(request.state)) {
    throw new SqlQueueValidationError(`job state ${describe(request.state)} is invalid: use ${STATES.join(', ')}`);
  }
  const limit = assertInteger('job list limit', request.limit, 1, JOB_LIST_MAX_LIMIT, SqlQueueValidationError);
  const cursor = request.cursor ?? null;
  return { queue, state: request.state, limit, after: cursor === null ? null : decode(queue, request.state, cursor) };
}

function decode(queue: string, state: ListedJobState, cursor: unknown): JobListPosition {
  const refuse = (problem: string): never => {
    throw new SqlQueueValidationError(
      `the cursor for ${state} jobs of queue '${queue}' is malformed (${problem}): pass the nextCursor of the previous page unchanged, or no cursor for the first page`,
    );
  };
  if (typeof cursor !== 'string' || !/^[A-Za-z0-9_-]{1,2048}$/.test(cursor)) return refuse('not base64url text');
  let json: Partial<CursorJson>;
  try {
    json = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as Partial<CursorJson>;
  } catch {
    return refuse('not a listing cursor');
  }
  if (json === null || typeof json !== 'object' || json.v !== 1) return refuse('not a listing cursor');
  if (json.q !== queue || json.s !== state) {
    return refuse(`it belongs to the listing of ${describe(json.s)} jobs of queue ${describe(json.q)}`);
  }
  if (json.p !== 'u' && json.p !== 'g') return refuse('no part');
  const part = json.p === 'g' ? 'grouped' : 'ungrouped';
  if (part === 'grouped' && state !== 'ready' && state !== 'delayed') {
    return refuse('only ready and delayed jobs have a grouped part');
  }
  if (typeof json.i !== 'string' || !isJobId(json.i)) return refuse('no valid job id');
  const needs = positionFields(state, part);
  const priority = json.r ?? null;
  if (needs.priority !== (priority !== null) || (priority !== null && !isInt32(priority)))
    return refuse('no valid priority');
  const time = json.t ?? null;
  if (needs.time !== (time !== null) || (time !== null && !isUtcTime(time))) return refuse('no valid time');
  const groupKey = json.g ?? null;
  if ((part === 'grouped') !== (groupKey !== null) || (groupKey !== null && !isGroupKey(groupKey)))
    return refuse('no valid group key');
  return { part, id: json.i, priority, time, groupKey };
}

function isJobId(value: string): boolean {
  return passes(() => assertJobId(value));
}

/** A key a group can have: one with U+0000 or a lone surrogate would fail the statement, not the check. */
function isGroupKey(value: unknown): boolean {
  return passes(() => assertKeyText('cursor', 'group key', value));
}

function passes(check: () => unknown): boolean {
  try {
    check();
    return true;
  } catch {
    return false;
  }
}

function isInt32(value: unknown): boolean {
  return typeof value === 'number' && Number.isInteger(value) && value >= -2_147_483_648 && value <= 2_147_483_647;
}

/**
 * A time both databases take. Date.parse rolls impossible dates over (February 30, 24:00) and
 * takes year 0, which the databases refuse in the statement: the text must read back the same.
 */
function isUtcTime(value: unknown): boolean {
  if (typeof value !== 'string' || !/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,7})?Z$/.test(value)) return false;
  const ms = Date.parse(value);
  return (
    !Number.isNaN(ms) && !value.startsWith('0000') && new Date(ms).toISOString().slice(0, 19) === value.slice(0, 19)
  );
}

/**
 * A listing's rows split into the page and the row the next page starts after (null: no next
 * page). The rows come in listing order: the page, then one more row when a next page exists.
 * A grouped look-up that stopped at GROUP_SCAN_LIMIT entries ends the rows with the last entry
 * it read (`endsScan`), in the listed state or not (`listed`). The next page starts after that
 * entry, since every entry before it was read, unless it is a job the next page must show (the
 * one row more): then after the page's last row, as always.
 */
export function splitJobListRows<R>(
  rows: readonly R[],
  limit: number,
  endsScan: (row: R) => boolean,
  listed: (row: R) => boolean,
): { page: R[]; last: R | null } {
  const page = rows.slice(0, limit);
  const end = rows.at(-1);
  const more = rows.length > limit;
  if (end !== undefined && endsScan(end) && !(more && listed(end))) return { page, last: end };
  return { page, last: more ? page[limit - 1]! : null };
}
