// Ordered groups: the release of groups a statement moved on, the settling of emptied groups,
// blocked-group listings and the repair sweep.
import type { PgTables } from './tables.js';

export function groupRelease(t: PgTables, changed: string): string {
  const { jobs, groups } = t;
  return releaseGroups(jobs, groups, changed);
}

// A LATERAL join giving `n`: the lowest unfinished job (id, run_at, priority) of the group in
// `alias` (columns queue and `keyColumn`), one seek on jobs_group_ix.
export function firstUnfinished(t: PgTables, alias: string, keyColumn = 'group_key'): string {
  const { jobs } = t;
  return `LEFT JOIN LATERAL (
  SELECT u.id, u.run_at, u.priority FROM ${jobs} u
  WHERE u.queue = ${alias}.queue AND u.group_key = ${alias}.${keyColumn} AND u.state IN ('ready', 'delayed', 'leased')
  ORDER BY u.id LIMIT 1
) AS n ON true`;
}

// The same as a row subquery (id, run_at, priority), for SET and EXISTS.
function firstUnfinishedRow(t: PgTables, alias: string, extra?: string): string {
  const { jobs } = t;
  return `SELECT u.id, u.run_at, u.priority${extra ? `, ${extra}` : ''} FROM ${jobs} u
    WHERE u.queue = ${alias}.queue AND u.group_key = ${alias}.group_key AND u.state IN ('ready', 'delayed', 'leased')
    ORDER BY u.id LIMIT 1`;
}

// What is wrong with group row `g` whose first unfinished job is `n` (null: nothing). The
// jobs table is the oracle: a held group needs a job leased with its token; a blocked one, a
// dead job of the group as its head; any other, its lowest unfinished job as its head.
function groupProblem(t: PgTables, g: string, n: string): string {
  const { jobs } = t;
  return `CASE
    WHEN ${g}.held_token IS NOT NULL AND ${g}.held_token NOT IN (
      SELECT l.claim_token FROM ${jobs} l WHERE l.state = 'leased' AND l.group_key IS NOT NULL AND l.claim_token IS NOT NULL)
      THEN 'held by token ' || ${g}.held_token::text || ', which no leased job of the group has'
    WHEN ${g}.blocked AND NOT EXISTS (
      SELECT 1 FROM ${jobs} d
      WHERE d.id = ${g}.head_id AND d.queue = ${g}.queue AND d.group_key = ${g}.group_key AND d.state = 'dead')
      THEN 'blocked by job ' || COALESCE(${g}.head_id::text, '(none)') || ', which is not a dead job of the group'
    WHEN ${g}.held_token IS NULL AND NOT ${g}.blocked AND ${g}.head_id IS DISTINCT FROM ${n}.id
      THEN 'head ' || COALESCE(${g}.head_id::text, '(none)') || ' is not the first unfinished job '
           || COALESCE(${n}.id::text, '(none)')
  END`;
}

// $1 queue, $2 keys, $3 job ids (one entry per group): the lowest job id this call added to
// (or retried in) each group of the queue. Arrays, not json, so the planner knows how many
// rows come in (a plain, not prepared, statement is planned with its values); each group is
// one primary-key lookup, and the CTEs are compared through joins or hashed lists, never
// scanned once per row. Runs in the producer's transaction, after the insert, and before touchMove. A group
// with no row gets one with the job as head ('created'). An existing row is locked FOR KEY
// SHARE ('locked'), which neither claims (FOR NO KEY UPDATE) nor completions conflict with, so
// a caller's long transaction holds up no one; a completion that emptied the group settles it
// only once this transaction is over (settleLock skips the row until then and tries again), so
// the job is either seen by the settling or made the head by touchMove, never neither. A row this statement's
// snapshot cannot see (created or deleted concurrently) is 'missing', and the store runs the
// statement again. A head not due yet waits (`waiting`); due is judged on this statement's
// clock, since now() is the caller's transaction start, older than the job.
export function touchLock(t: PgTables): string {
  const { jobs, groups } = t;
  return `WITH input AS MATERIALIZED (
  SELECT i.key, i.id, j.run_at, j.priority
  FROM unnest($2::text[], $3::bigint[]) AS i(key, id)
  -- LIMIT keeps the lookup a per-row primary-key probe (the planner would rather hash the table).
  CROSS JOIN LATERAL (
    SELECT run_at, priority FROM ${jobs} WHERE id = i.id AND state IN ('ready', 'delayed') LIMIT 1
  ) AS j
), locked AS MATERIALIZED (
  -- One primary-key probe per group, whatever the statistics say (a queue they have not seen
  -- yet is estimated at one row, and a join then compared every group with every input).
  SELECT g.group_key FROM (SELECT key FROM input ORDER BY key) AS i
  CROSS JOIN LATERAL (
    SELECT group_key FROM ${groups} WHERE queue = $1 AND group_key = i.key FOR KEY SHARE
  ) AS g
), created AS (
  INSERT INTO ${groups} (queue, group_key, head_id, head_ready_at, head_priority, waiting)
  SELECT $1, key, id, run_at, priority, run_at > statement_timestamp() FROM input
  WHERE key NOT IN (SELECT group_key FROM locked)
  ORDER BY key
  ON CONFLICT (queue, group_key) DO NOTHING
  RETURNING group_key
)
SELECT i.key, i.id::text AS id,
  CASE WHEN l.group_key IS NOT NULL THEN 'locked' WHEN c.group_key IS NOT NULL THEN 'created' ELSE 'missing' END AS status
FROM input i
LEFT JOIN locked l ON l.group_key = i.key
LEFT JOIN created c ON c.group_key = i.key`;
}

// $1 queue, $2 keys, $3 job ids: the groups touchLock locked, headed by the lowest new id of
// each; $4 keys, $5 ids: every job retryDead moved back, since a blocked group is released
// when its blocking job is one of them. A new statement, so its snapshot is younger than the
// lock: it sees every transition committed before the lock, and one running now makes this
// UPDATE wait and re-check (a decision taken on touchLock's older snapshot could miss a group
// just emptied, and leave the job to a settling that had already passed). The head moves to
// the job when the group is idle, or not held and headed by a later job (an earlier-numbered
// job committing late), or blocked by a job just retried.
export function touchMove(t: PgTables): string {
  const { jobs, groups } = t;
  return `UPDATE ${groups} AS g
SET head_id = i.id, head_ready_at = j.run_at, head_priority = j.priority, waiting = j.run_at > statement_timestamp(),
    blocked = false, updated_at = now()
FROM unnest($2::text[], $3::bigint[]) AS i(key, id)
CROSS JOIN LATERAL (SELECT run_at, priority FROM ${jobs} WHERE id = i.id LIMIT 1) AS j
WHERE g.queue = $1 AND g.group_key = ANY ($2::text[]) AND g.group_key = i.key AND g.held_token IS NULL
  AND ((NOT g.blocked AND (g.head_id IS NULL OR g.head_id > i.id))
       OR (g.blocked AND g.head_id IN (SELECT r.id FROM unnest($4::text[], $5::bigint[]) AS r(key, id)
                                       WHERE r.key = g.group_key)))`;
}

// $1 queues, $2 keys, $3 tokens: groups whose token the reaper voided. A completion of
// another job of the batch, running at the same time, may have kept the group held (it saw
// the reaped job still leased) while the reaper, on its older snapshot, saw that completion's
// job still leased too: neither let the group go. Run after the reap committed (which waited
// for that completion), this sees both: a group still held by a token no job is leased with
// is released, headed by its lowest unfinished job (none: emptied, settled as usual).
export function releaseVoidHolds(t: PgTables): string {
  const { jobs, groups } = t;
  return `UPDATE ${groups} AS g
SET held_token = NULL,
    head_id = (SELECT u.id FROM (${firstUnfinishedRow(t, 'g')}) AS u),
    head_ready_at = (SELECT u.run_at FROM (${firstUnfinishedRow(t, 'g')}) AS u),
    head_priority = (SELECT u.priority FROM (${firstUnfinishedRow(t, 'g')}) AS u),
    waiting = COALESCE((SELECT u.run_at > now() FROM (${firstUnfinishedRow(t, 'g')}) AS u), false),
    updated_at = now()
FROM unnest($1::text[], $2::text[], $3::uuid[]) AS t(queue, key, token)
WHERE g.queue = t.queue AND g.group_key = t.key AND g.held_token = t.token
  AND NOT EXISTS (SELECT 1 FROM ${jobs} s WHERE s.claim_token = t.token AND s.state = 'leased' AND s.group_key IS NOT NULL)
RETURNING g.queue, g.group_key AS key, g.head_id IS NULL AS emptied`;
}

// $1 queue, $2 keys: groups of the queue a transition emptied. Locks those still idle and
// headless, skipping any a producer holds (its FOR KEY SHARE) or another session is settling.
// One queue and an array of keys: a primary-key index condition, whatever the planner thinks
// of how many groups are idle (its statistics see none, since none stays idle for long).
export function settleLock(t: PgTables): string {
  const { groups } = t;
  return `WITH locked AS MATERIALIZED (
  SELECT group_key FROM ${groups}
  WHERE queue = $1 AND group_key = ANY ($2::text[]) AND head_id IS NULL AND held_token IS NULL AND NOT blocked
  ORDER BY group_key
  FOR UPDATE SKIP LOCKED
)
SELECT group_key AS key, true AS locked FROM locked
UNION ALL
-- Still to settle but held by someone (a producer's FOR KEY SHARE): tried again later. A group
-- that is neither (headed again, or gone) needs nothing more.
SELECT group_key, false FROM ${groups}
WHERE queue = $1 AND group_key = ANY ($2::text[]) AND head_id IS NULL AND held_token IS NULL AND NOT blocked
  AND group_key NOT IN (SELECT group_key FROM locked)`;
}

// $1 queue, $2 keys: groups settleLock locked, read again in a new statement (a new
// snapshot, which sees every producer that held them): the lowest unfinished job becomes the
// head, and a group with none is deleted (producers create it again).
export function settleApply(t: PgTables): string {
  const { groups } = t;
  return `WITH headed AS (
  UPDATE ${groups} AS g
  SET (head_id, head_ready_at, head_priority, waiting) = (${firstUnfinishedRow(t, 'g', 'u.run_at > now()')}),
      updated_at = now()
  WHERE g.queue = $1 AND g.group_key = ANY ($2::text[])
    AND g.head_id IS NULL AND g.held_token IS NULL AND NOT g.blocked AND EXISTS (${firstUnfinishedRow(t, 'g')})
)
DELETE FROM ${groups} AS g
WHERE g.queue = $1 AND g.group_key = ANY ($2::text[])
  AND g.head_id IS NULL AND g.held_token IS NULL AND NOT g.blocked AND NOT EXISTS (${firstUnfinishedRow(t, 'g')})`;
}

// $1, $2 the last group row checked, $3, $4 the last group of jobs walked (nulls: from the
// start), $5 page size. The repair sweep's look, without a lock: the next page of group rows
// checked against their jobs (groupProblem), and the next page of distinct groups that have
// unfinished jobs (a loose index scan on jobs_group_ix, one seek per group) checked for a
// group row. Normally it finds nothing and is the sweep's only statement; what it finds is
// checked again under a lock (repairLock, repairApply, repairOrphans) before anything is fixed,
// since a transition may be between its statements right now. The last two rows say where
// each page ended (null when it reached the end).
export function repairCheck(t: PgTables): string {
  const { jobs, groups } = t;
  return `WITH RECURSIVE page AS MATERIALIZED (
  SELECT * FROM ${groups}
  WHERE $1::varchar IS NULL OR (queue, group_key) > ($1::varchar, $2::varchar)
  ORDER BY queue, group_key
  LIMIT $5
), walk(queue, group_key, n) AS (
  (SELECT queue, group_key, 1 FROM ${jobs}
   WHERE group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased')
     AND ($3::varchar IS NULL OR (queue, group_key) > ($3::varchar, $4::varchar))
   ORDER BY queue, group_key LIMIT 1)
  UNION ALL
  SELECT x.queue, x.group_key, w.n + 1 FROM walk w
  CROSS JOIN LATERAL (
    SELECT queue, group_key FROM ${jobs}
    WHERE group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased') AND (queue, group_key) > (w.queue, w.group_key)
    ORDER BY queue, group_key LIMIT 1
  ) AS x
  WHERE w.n < $5
)
SELECT 'row' AS kind, g.queue, g.group_key AS key FROM page g
${firstUnfinished(t, 'g')}
WHERE ${groupProblem(t, 'g', 'n')} IS NOT NULL OR (n.id IS NULL AND g.head_id IS NULL AND g.held_token IS NULL AND NOT g.blocked)
UNION ALL
SELECT 'orphan', w.queue, w.group_key FROM walk w
WHERE NOT EXISTS (SELECT 1 FROM ${groups} g WHERE g.queue = w.queue AND g.group_key = w.group_key)
UNION ALL
SELECT 'rows-end', queue, group_key FROM (
  SELECT queue, group_key FROM page WHERE (SELECT count(*) FROM page) = $5 ORDER BY queue DESC, group_key DESC LIMIT 1
) AS last_row
UNION ALL
SELECT 'walk-end', queue, group_key FROM (
  SELECT queue, group_key FROM walk WHERE (SELECT count(*) FROM walk) = $5 ORDER BY n DESC LIMIT 1
) AS last_group`;
}

// $1 queues, $2 keys: suspects of repairCheck, locked so that no transition runs while they
// are checked again; rows another session holds (a claim, a producer, a transition) are
// skipped and looked at on a later pass.
export function repairLock(t: PgTables): string {
  const { groups } = t;
  return `SELECT g.queue, g.group_key AS key FROM (SELECT * FROM ${GROUPS_IN} ORDER BY queue, key) AS i
CROSS JOIN LATERAL (
  SELECT queue, group_key FROM ${groups} WHERE queue = i.queue AND group_key = i.key FOR UPDATE SKIP LOCKED
) AS g`;
}

// $1 queues, $2 keys locked by repairLock, read again in a new statement. The oracle is
// the jobs table (groupProblem). A row that disagrees is set right (or deleted when the group
// has no unfinished job) and returned with what was wrong; a headless row with no job left is
// deleted silently (an emptied group whose settling was cut short), not reported.
export function repairApply(t: PgTables): string {
  const { groups } = t;
  return `WITH checked AS MATERIALIZED (
  SELECT g.queue, g.group_key, g.head_id, g.held_token, g.blocked, n.id AS first_id, n.run_at, n.priority,
         ${groupProblem(t, 'g', 'n')} AS problem
  FROM ${GROUPS_IN}
  JOIN ${groups} g ON g.queue = i.queue AND g.group_key = i.key
  ${firstUnfinished(t, 'g')}
), fixed AS (
  UPDATE ${groups} AS g
  SET held_token = NULL, blocked = false, head_id = c.first_id, head_ready_at = c.run_at, head_priority = c.priority,
      waiting = COALESCE(c.run_at > now(), false),
      updated_at = now()
  FROM checked c
  WHERE g.queue = c.queue AND g.group_key = c.group_key AND c.problem IS NOT NULL AND c.first_id IS NOT NULL
), removed AS (
  DELETE FROM ${groups} AS g USING checked c
  WHERE g.queue = c.queue AND g.group_key = c.group_key AND c.first_id IS NULL
    AND (c.problem IS NOT NULL OR (c.head_id IS NULL AND c.held_token IS NULL AND NOT c.blocked))
)
SELECT queue, group_key AS key, problem FROM checked WHERE problem IS NOT NULL`;
}

// $1 queues, $2 keys: groups repairCheck found with unfinished jobs and no row. Producers
// create the row in the transaction that adds the job, so a committed job without one is a
// fault: the group gets a row headed by its lowest unfinished job.
export function repairOrphans(t: PgTables): string {
  const { groups } = t;
  return `INSERT INTO ${groups} (queue, group_key, head_id, head_ready_at, head_priority, waiting)
SELECT i.queue, i.key, n.id, n.run_at, n.priority, n.run_at > now()
FROM ${GROUPS_IN}
${firstUnfinished(t, 'i', 'key')}
WHERE n.id IS NOT NULL
ORDER BY i.queue, i.key
ON CONFLICT (queue, group_key) DO NOTHING
RETURNING queue, group_key AS key, head_id::text AS head_id`;
}

// $1 queue, $2 after key (or null), $3 limit
export function listBlockedGroups(t: PgTables): string {
  const { jobs, groups } = t;
  return `SELECT g.group_key, g.head_id::text AS job_id, j.last_error, j.finished_at
FROM ${groups} g LEFT JOIN ${jobs} j ON j.id = g.head_id
WHERE g.queue = $1 AND g.blocked AND ($2::varchar IS NULL OR g.group_key > $2::varchar)
ORDER BY g.group_key
LIMIT $3`;
}

/**
 * The group side of a statement that moves leased jobs on (complete, fail, release, reap), as
 * CTEs to append after `changed`: a CTE of the jobs this statement changed, with columns id,
 * queue, group_key, token (the claim token they held), state, run_at and priority (their new
 * values) and block (the job died and its queue's groups stop on a dead job).
 *
 * A group held by the token is released once no job of it is leased with that token any more
 * (a group batch holds it until its last job is done); its head becomes the dead job that blocks
 * it, else its lowest unfinished job. The statement's snapshot still shows the changed jobs as
 * they were, so they are taken from `changed`, never from the table. A group held by another
 * token is left alone; one held by no token (left by a version before 4, or by the repair
 * sweep) is settled the same way unless it is blocked.
 *
 * No unfinished job in the snapshot: the group is released with no head and reported as
 * emptied (group_released.emptied). A producer may be adding a job to it right now, unseen by
 * this snapshot, after seeing the group held (so it left the head to us); the store settles
 * emptied groups once such producers are done (see settleLock).
 */
function releaseGroups(jobs: string, groups: string, changed: string): string {
  return `, group_touched AS MATERIALIZED (
  -- One row per group and token, from one pass over the changed jobs (never one per group).
  SELECT queue, group_key, token, array_agg(id) AS changed_ids,
         min(id) FILTER (WHERE block) AS blocking_id,
         min(id) FILTER (WHERE state IN ('ready', 'delayed')) AS back_id,
         (array_agg(run_at ORDER BY id) FILTER (WHERE state IN ('ready', 'delayed')))[1] AS back_run_at,
         (array_agg(priority ORDER BY id) FILTER (WHERE state IN ('ready', 'delayed')))[1] AS back_priority
  FROM ${changed} WHERE group_key IS NOT NULL
  GROUP BY queue, group_key, token
), still_leased AS MATERIALIZED (
  -- Tokens that other jobs are still leased with (the rest of a group batch), in one set-based
  -- read for all groups: a probe per group could walk every leased job of the queue each time.
  -- An array, not a semi-join: the planner takes group_touched for one row and would scan it
  -- once per leased job.
  SELECT DISTINCT s.claim_token AS token FROM ${jobs} s
  WHERE s.claim_token = ANY (ARRAY(SELECT token FROM group_touched)) AND s.state = 'leased' AND s.group_key IS NOT NULL
    AND s.id NOT IN (SELECT c.id FROM ${changed} c)
), group_next AS MATERIALIZED (
  SELECT t.queue, t.group_key, t.token, t.blocking_id,
    t.token IN (SELECT token FROM still_leased) AS still_held,
    n.id AS head_id, n.run_at AS head_ready_at, n.priority AS head_priority
  FROM group_touched t
  LEFT JOIN LATERAL (
    SELECT x.id, x.run_at, x.priority FROM (
      (SELECT u.id, u.run_at, u.priority FROM ${jobs} u
       WHERE u.queue = t.queue AND u.group_key = t.group_key AND u.state IN ('ready', 'delayed', 'leased')
         AND u.id <> ALL (t.changed_ids)
       ORDER BY u.id LIMIT 1)
      UNION ALL
      SELECT t.back_id, t.back_run_at, t.back_priority WHERE t.back_id IS NOT NULL
    ) AS x
    ORDER BY x.id LIMIT 1
  ) AS n ON true
), group_released AS (
  UPDATE ${groups} AS g
  SET held_token = NULL,
      blocked = n.blocking_id IS NOT NULL,
      head_id = COALESCE(n.blocking_id, n.head_id),
      head_ready_at = CASE WHEN n.blocking_id IS NULL THEN n.head_ready_at END,
      waiting = COALESCE(n.blocking_id IS NULL AND n.head_ready_at > now(), false),
      head_priority = CASE WHEN n.blocking_id IS NULL THEN n.head_priority END,
      updated_at = now()
  FROM group_next n
  WHERE g.queue = n.queue AND g.group_key = n.group_key AND NOT n.still_held
    AND (g.held_token = n.token OR (g.held_token IS NULL AND NOT g.blocked))
  RETURNING g.queue, g.group_key, g.head_id IS NULL AS emptied
)`;
}

/**
 * The groups a statement emptied, as one json array [{queue, key}] on its first row only (null on
 * the others, and when none): repeated on every row, a batch of 500 completions that emptied
 * 500 groups sent 500 copies of it, and parsing them cost more than the statement.
 */
export const EMPTIED_GROUPS = `CASE WHEN row_number() OVER () = 1 THEN
    (SELECT json_agg(json_build_object('queue', queue, 'key', group_key)) FROM group_released WHERE emptied)
  END AS emptied_groups`;

/** The groups a group statement takes: $1 queues and $2 keys, as arrays of the same length. */
const GROUPS_IN = 'unnest($1::text[], $2::text[]) AS i(queue, key)';
