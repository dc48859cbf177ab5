// Listings: a job and its attempts, dead jobs, and the dashboard's keyset-paged job lists.
import { GROUP_SCAN_LIMIT } from '../../../core/types.js';
import type { PgTables } from './tables.js';

export function getJob(t: PgTables): string {
  const { jobs } = t;
  return `SELECT ${JOB_COLUMNS} FROM ${jobs} WHERE id = $1`;
}

// $1 id. getJob with a locking read: it waits for a transaction still holding the row (a
// handler's commit whose reply was lost) to end, then reads the row as that left it (under READ
// COMMITTED, FOR SHARE follows an update that committed meanwhile), not the snapshot from before.
export function getJobAfterWriters(t: PgTables): string {
  return `${getJob(t)} FOR SHARE`;
}

export function getAttempts(t: PgTables): string {
  const { jobs, attempts } = t;
  return `SELECT attempt, outcome, error, stack, worker_id, started_at, finished_at
FROM ${attempts} WHERE job_id = $1
UNION ALL
SELECT attempts, 'completed', NULL, NULL, worker_id, claimed_at, finished_at
FROM ${jobs} WHERE id = $1 AND state = 'done'
ORDER BY finished_at, attempt`;
}

// $1 queue, $2 after id (or null), $3 limit
// ORDER BY names the table's column: the select list's `id` is text and would sort 10 before 9.
export function listDead(t: PgTables): string {
  const { jobs } = t;
  return `SELECT ${JOB_COLUMNS} FROM ${jobs} AS j
WHERE j.queue = $1 AND j.state = 'dead' AND j.id > COALESCE($2::bigint, 0)
ORDER BY j.id
LIMIT $3`;
}

// Each listing selects its page of ids through the partial index that already serves the
// state, by keyset ("after the last job listed", never OFFSET), then reads the summary of those
// rows only: previews are cut here, so a page never carries whole payloads. Every one takes $1
// queue, $2 rows (the page and one more, which tells whether a next page exists), $3 preview
// characters, then the position after which the page starts. A first page passes a position
// before every job, and a page in the grouped part one after every ungrouped job, so each
// statement has one shape and no condition on which page it is.
// $4 priority (bigint, so 2^31 stands before every job), $5 run_at, $6 id: the ungrouped
// position; $7 group_key, $8 id: the grouped one. The ungrouped part is claim order on
// jobs_claim_ix: the rest of the position's priority, then the lower priorities. Keyed jobs
// (jobs_key_ready_ix, in key order) join it sorted: a top-N sort over the queue's keyed ready rows.
export function listReadyJobs(t: PgTables): string {
  const { jobs } = t;
  return readyOrDelayedPage(
    jobs,
    'ready',
    `SELECT id, 0 AS part, priority, run_at, NULL::varchar AS group_key FROM (
    (SELECT id, priority, run_at FROM ${jobs}
     WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND priority = $4::bigint
       AND (run_at, id) > ($5::timestamptz, $6::bigint)
     ORDER BY run_at, id LIMIT $2)
    UNION ALL
    (SELECT id, priority, run_at FROM ${jobs}
     WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND priority < $4::bigint
     ORDER BY priority DESC, run_at, id LIMIT $2)
    UNION ALL
    (SELECT id, priority, run_at FROM ${jobs}
     WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL
       AND (priority < $4::bigint OR (priority = $4::bigint AND (run_at, id) > ($5::timestamptz, $6::bigint)))
     ORDER BY priority DESC, run_at, id LIMIT $2)
  ) AS u
  ORDER BY priority DESC, run_at, id LIMIT $2`,
    'p.priority DESC, p.run_at',
    7,
  );
}

// $4 run_at, $5 id: the ungrouped position ('infinity' once in the grouped part), on
// jobs_delayed_ix; $6 group_key, $7 id: the grouped one.
export function listDelayedJobs(t: PgTables): string {
  const { jobs } = t;
  return readyOrDelayedPage(
    jobs,
    'delayed',
    `SELECT id, 0 AS part, NULL::int AS priority, run_at, NULL::varchar AS group_key FROM ${jobs}
  WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND (run_at, id) > ($4::timestamptz, $5::bigint)
  ORDER BY run_at, id LIMIT $2`,
    'p.run_at',
    6,
  );
}

// $4 lease_until, $5 id. jobs_leased_ix holds (queue, lease_until): the position bounds the
// index range and ties on lease_until are put in id order (few: leased jobs are running ones).
export function listLeasedJobs(t: PgTables): string {
  const { jobs } = t;
  return `SELECT ${summaryColumns('lease_until')}
FROM (
  SELECT id, lease_until FROM ${jobs}
  WHERE queue = $1 AND state = 'leased' AND (lease_until, id) > ($4::timestamptz, $5::bigint)
  ORDER BY lease_until, id LIMIT $2
) AS p
JOIN ${jobs} j ON j.id = p.id
ORDER BY p.lease_until, p.id`;
}

// $4 finished_at, $5 id ('infinity' for the first page), $6 how many completions to look
// through. Done rows are indexed by finish time only (jobs_done_ix, of all queues), so the
// look-up walks the $6 most recent completions, newest first, and keeps the queue's: its
// cost is bounded whatever the history holds. `scanned` (on every row, and on the one row
// with no job when the page is empty) tells whether the walk reached its bound.
export function listDoneJobs(t: PgTables): string {
  const { jobs } = t;
  return `WITH recent AS MATERIALIZED (
  SELECT id, queue, finished_at FROM ${jobs}
  WHERE state = 'done'
  ORDER BY finished_at DESC, id DESC
  LIMIT $6
), p AS MATERIALIZED (
  SELECT id, finished_at FROM recent
  WHERE queue = $1 AND (finished_at, id) < ($4::timestamptz, $5::bigint)
  ORDER BY finished_at DESC, id DESC
  LIMIT $2
)
SELECT (SELECT count(*) FROM recent)::int AS scanned, page.*
FROM (VALUES (1)) AS one (x)
LEFT JOIN (
  SELECT ${summaryColumns('finished_at')}, p.finished_at AS sort_time, p.id AS sort_id
  FROM p JOIN ${jobs} j ON j.id = p.id
) AS page ON true
ORDER BY page.sort_time DESC, page.sort_id DESC`;
}

// $4 id: the page holds ids up to it (the last one listed minus one; the largest bigint first).
export function listDeadJobs(t: PgTables): string {
  const { jobs } = t;
  return `SELECT ${summaryColumns('finished_at')}
FROM (
  SELECT id FROM ${jobs}
  WHERE queue = $1 AND state = 'dead' AND id <= $4::bigint
  ORDER BY id DESC LIMIT $2
) AS p
JOIN ${jobs} j ON j.id = p.id
ORDER BY p.id DESC`;
}

const JOB_COLUMNS = `id::text AS id, queue, state, payload, priority, run_at, group_key, idempotency_key,
  attempts, max_attempts, claim_token::text AS claim_token, lease_until, worker_id, created_at,
  claimed_at, finished_at, last_error, cancel_requested_at, cancel_reason, result, progress, concurrency_key`;

/** A time as UTC ISO 8601 text to the microsecond (a listing cursor's position; a Date keeps ms). */
const utcText = (column: string) => `to_char(${column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`;

/**
 * A listed job (JobSummary) from row `j`, with previews of $3 characters; `cursorTime` is the
 * time the state's order sorts by, as the cursor keeps it.
 */
const summaryColumns = (cursorTime: string) => `j.id::text AS id, j.queue, j.state, j.priority, j.run_at, j.group_key,
  j.idempotency_key, j.attempts, j.max_attempts, j.lease_until, j.worker_id, j.created_at, j.claimed_at,
  j.finished_at, left(j.payload::text, $3) AS payload_preview, left(j.last_error, $3) AS last_error_preview,
  ${utcText(`j.${cursorTime}`)} AS cursor_time`;

/**
 * A ready or delayed listing: `ungrouped`, the page's jobs outside ordered groups (columns id,
 * part 0, priority, run_at, group_key NULL; at most $2 rows, in listing order), then the grouped
 * part, each row with its summary.
 *
 * The grouped part walks jobs_group_ix from the position ($first group_key, $first+1 id) in
 * (group_key, id) order, at most GROUP_SCAN_LIMIT entries: the index holds the queue's grouped
 * ready, delayed and leased jobs, and state is not among its keys. It keeps the jobs in `state`
 * and the last entry it read (scan_end: the next page starts after it), as many as the page
 * still needs; once the ungrouped part filled the page, that LIMIT is 0 and the walk never runs.
 * The walk takes one entry a step: asked for GROUP_SCAN_LIMIT rows at once, the planner may read
 * the whole rest of the index range in a bitmap scan and sort it, when the queue's rows lie close
 * together. A recursive query yields its rows as each step makes them, in the walk's order, and
 * stops when the LIMIT above has what it needs.
 */
function readyOrDelayedPage(
  jobs: string,
  state: 'ready' | 'delayed',
  ungrouped: string,
  order: string,
  first: number,
): string {
  const entries = `SELECT id, group_key, state FROM ${jobs}
    WHERE queue = $1 AND group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased')`;
  return `WITH RECURSIVE ungrouped AS MATERIALIZED (
  ${ungrouped}
), walk AS (
  (SELECT 1 AS n, e.* FROM (
    ${entries} AND (group_key, id) > ($${first}::varchar, $${first + 1}::bigint)
    ORDER BY group_key, id LIMIT 1) AS e)
  UNION ALL
  SELECT w.n + 1, e.* FROM walk AS w CROSS JOIN LATERAL (
    ${entries} AND (group_key, id) > (w.group_key, w.id)
    ORDER BY group_key, id LIMIT 1) AS e
  WHERE w.n < ${GROUP_SCAN_LIMIT}
)
SELECT ${summaryColumns('run_at')}, p.scan_end
FROM (
  SELECT id, part, priority, run_at, group_key, false AS scan_end FROM ungrouped
  UNION ALL
  (SELECT id, 1, NULL::int, NULL::timestamptz, group_key, n = ${GROUP_SCAN_LIMIT} FROM walk
   WHERE state = '${state}' OR n = ${GROUP_SCAN_LIMIT}
   LIMIT $2::bigint - (SELECT count(*) FROM ungrouped))
) AS p
JOIN ${jobs} j ON j.id = p.id
ORDER BY p.part, ${order}, p.group_key, p.id`;
}
