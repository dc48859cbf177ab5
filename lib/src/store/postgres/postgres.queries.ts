import { GROUP_SCAN_LIMIT } from '../../core/types.js';
import { quotePgIdentifier } from './postgres.identifiers.js';

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
export interface PgQueries {
  enqueueOne: string;
  enqueueMany: string;
  enqueueManyUniform: string;
  recordQueueSettings: string;
  findByIdempotencyKeys: string;
  claim: string;
  heartbeat: string;
  complete: string;
  fail: string;
  release: string;
  reap: string;
  touchLock: string;
  touchMove: string;
  releaseVoidHolds: string;
  settleLock: string;
  settleApply: string;
  repairCheck: string;
  repairLock: string;
  repairApply: string;
  repairOrphans: string;
  listBlockedGroups: string;
  hasClaimableWork: string;
  stats: string;
  getJob: string;
  getAttempts: string;
  listDead: string;
  retryDead: string;
  retryAllDead: string;
  purgeDead: string;
  cleanup: string;
  notify: string;

  // ---- browsing jobs and counting outcomes (the dashboard) ----
  listReadyJobs: string;
  listDelayedJobs: string;
  listLeasedJobs: string;
  listDoneJobs: string;
  listDeadJobs: string;
  recordThroughput: string;
  readThroughput: string;
  cleanupThroughput: string;

  // ---- health and measurements ----
  monitoringSettings: string;
  queueHealth: string;

  // ---- recurring jobs (schedules) ----
  scheduleDueIn: string;
  scheduleLockDue: string;
  scheduleAdvance: string;
  scheduleUpsert: string;
  schedulePrune: string;
  scheduleGet: string;
  scheduleList: string;
  scheduleDelete: string;
  schedulePause: string;
}

const SCHEDULE_COLUMNS = `id, queue, cron, timezone, payload, options, catch_up, paused, source, next_run_at,
  last_run_at, last_tick, created_at, updated_at`;

const JOB_COLUMNS = `id::text AS id, queue, state, payload, priority, run_at, group_key, idempotency_key,
  attempts, max_attempts, claim_token::text AS claim_token, lease_until, worker_id, created_at,
  claimed_at, finished_at, last_error`;

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
const EMPTIED_GROUPS = `CASE WHEN row_number() OVER () = 1 THEN
    (SELECT json_agg(json_build_object('queue', queue, 'key', group_key)) FROM group_released WHERE emptied)
  END AS emptied_groups`;

/** The groups a group statement takes: $1 queues and $2 keys, as arrays of the same length. */
const GROUPS_IN = 'unnest($1::text[], $2::text[]) AS i(queue, key)';

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

export function pgQueries(schema: string): PgQueries {
  const jobs = `${quotePgIdentifier(schema)}.jobs`;
  const attempts = `${quotePgIdentifier(schema)}.attempts`;
  const jobIdSeq = `${quotePgIdentifier(schema)}.jobs_id_seq`;
  const settings = `${quotePgIdentifier(schema)}.queue_settings`;
  const groups = `${quotePgIdentifier(schema)}.groups`;
  const schedules = `${quotePgIdentifier(schema)}.schedules`;
  const throughput = `${quotePgIdentifier(schema)}.throughput`;
  const groupRelease = (changed: string) => releaseGroups(jobs, groups, changed);
  // A LATERAL join giving `n`: the lowest unfinished job (id, run_at, priority) of the group in
  // `alias` (columns queue and `keyColumn`), one seek on jobs_group_ix.
  const firstUnfinished = (alias: string, keyColumn = 'group_key') => `LEFT JOIN LATERAL (
  SELECT u.id, u.run_at, u.priority FROM ${jobs} u
  WHERE u.queue = ${alias}.queue AND u.group_key = ${alias}.${keyColumn} AND u.state IN ('ready', 'delayed', 'leased')
  ORDER BY u.id LIMIT 1
) AS n ON true`;
  // The same as a row subquery (id, run_at, priority), for SET and EXISTS.
  const firstUnfinishedRow = (
    alias: string,
    extra?: string,
  ) => `SELECT u.id, u.run_at, u.priority${extra ? `, ${extra}` : ''} FROM ${jobs} u
    WHERE u.queue = ${alias}.queue AND u.group_key = ${alias}.group_key AND u.state IN ('ready', 'delayed', 'leased')
    ORDER BY u.id LIMIT 1`;
  // What is wrong with group row `g` whose first unfinished job is `n` (null: nothing). The
  // jobs table is the oracle: a held group needs a job leased with its token; a blocked one, a
  // dead job of the group as its head; any other, its lowest unfinished job as its head.
  const groupProblem = (g: string, n: string) => `CASE
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
  // Whether a queue's groups stop on a dead job (recorded by its consumers; 'continue' if none).
  const blocksOnDead = (queue: string) =>
    `EXISTS (SELECT 1 FROM ${settings} s WHERE s.queue = ${queue} AND s.group_on_dead = 'block')`;
  // Batch siblings of the grouped jobs in `moved` (leased with the same token, not in `moved`) go
  // back to ready, their attempt given back: they never started. Found by their token alone
  // (jobs_batch_ix): a token is drawn for one group batch.
  const siblingsBack = (moved: string) => `siblings AS (
  UPDATE ${jobs} AS j
  SET state = 'ready', attempts = GREATEST(j.attempts - 1, 0), claim_token = NULL, lease_until = NULL,
      claimed_at = NULL, worker_id = NULL
  FROM unnest(ARRAY(SELECT DISTINCT token FROM ${moved} WHERE group_key IS NOT NULL)) AS m(token)
  WHERE j.claim_token = m.token AND j.state = 'leased' AND j.group_key IS NOT NULL
    AND j.id NOT IN (SELECT id FROM ${moved})
  RETURNING j.id, j.queue, j.group_key, m.token, j.state, j.run_at, j.priority
)`;
  // A job's attempts: its own, else what the queue's consumers recorded, else the producer's
  // default. The subquery names no input column, so it runs once per statement (an InitPlan).
  // $1 is cast as the column it is inserted into, or its type is deduced twice, differently.
  const maxAttempts = (own: string, fallback: string) =>
    `COALESCE(${own}, (SELECT s.max_attempts FROM ${settings} s WHERE s.queue = $1::varchar), ${fallback})`;

  // A job whose run_at is later than the statement's time waits as 'delayed', outside the ready
  // index the claim reads; the claim promotes it once due (see claim).
  const oneRunAt = `COALESCE($4::timestamptz, statement_timestamp() + $5::float8 * interval '1 millisecond')`;
  const manyRunAt = `COALESCE(run_at, statement_timestamp() + delay_ms * interval '1 millisecond')`;
  const stateFor = (runAt: string) => `CASE WHEN ${runAt} > statement_timestamp() THEN 'delayed' ELSE 'ready' END`;

  return {
    // $1 queue, $2 payload, $3 priority, $4 run_at, $5 delay_ms, $6 group_key, $7 idempotency_key,
    // $8 max_attempts (null: the queue's setting), $9 default max_attempts, $10 trace_context
    enqueueOne: `INSERT INTO ${jobs} (queue, state, payload, priority, run_at, group_key, idempotency_key, max_attempts,
                     trace_context, created_at)
VALUES ($1, ${stateFor(oneRunAt)}, $2::jsonb, $3, ${oneRunAt}, $6, $7,
        ${maxAttempts('$8::int', '$9::int')}, $10, statement_timestamp())
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id::text AS id`,

    // $1 queue, then one array per column ($2 payload jsonb[], $3 priority, $4 run_at, $5 delay_ms,
    // $6 group_key, $7 idempotency_key, $8 max_attempts (null elements: the queue's setting),
    // $9 default max_attempts, $10 trace_context). Typed arrays parse faster than one
    // JSON document. Ids are drawn before the insert so each input row keeps its id whether or
    // not it was inserted: results come back in input order without trusting RETURNING's order.
    enqueueMany: `WITH input AS MATERIALIZED (
  SELECT i.*, nextval('${jobIdSeq}') AS id
  FROM unnest($2::jsonb[], $3::int[], $4::timestamptz[], $5::float8[], $6::text[], $7::text[], $8::int[], $9::int[],
              $10::text[])
       WITH ORDINALITY AS i(payload, priority, run_at, delay_ms, group_key, idempotency_key, max_attempts, default_max_attempts,
                            trace_context, ord)
), inserted AS (
  INSERT INTO ${jobs} (id, queue, state, payload, priority, run_at, group_key, idempotency_key, max_attempts, trace_context,
                       created_at)
  SELECT id, $1, ${stateFor(manyRunAt)}, payload, priority, ${manyRunAt},
         group_key, idempotency_key, ${maxAttempts('max_attempts', 'default_max_attempts')}, trace_context,
         statement_timestamp()
  FROM input ORDER BY idempotency_key, ord
  ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
  RETURNING id
)
SELECT (input.ord - 1)::int AS ord, input.id::text AS id, (inserted.id IS NOT NULL) AS created
FROM input LEFT JOIN inserted ON inserted.id = input.id
ORDER BY input.ord`,

    // The common bulk case: no idempotency keys and the same options for every job, so only
    // the payloads travel, as one JSON array ($2: json, split before each payload becomes jsonb,
    // so the batch is not bound by jsonb's 256 MB per value); the rest are scalars ($3 priority, $4 run_at,
    // $5 delay_ms, $6 group_key, $7 max_attempts or null, $8 default max_attempts, $9 trace_context: an
    // enqueueMany's jobs share its span's). Every row is inserted (no conflict target), so the ids
    // drawn in input order are the answer.
    enqueueManyUniform: `WITH input AS MATERIALIZED (
  SELECT p::jsonb AS payload, ord, nextval('${jobIdSeq}') AS id
  FROM json_array_elements($2::json) WITH ORDINALITY AS t(p, ord)
), inserted AS (
  INSERT INTO ${jobs} (id, queue, state, payload, priority, run_at, group_key, max_attempts, trace_context, created_at)
  SELECT id, $1, ${stateFor(oneRunAt)}, payload, $3, ${oneRunAt},
         $6, ${maxAttempts('$7::int', '$8::int')}, $9::varchar, statement_timestamp()
  FROM input
)
SELECT id::text AS id FROM input ORDER BY ord`,

    // $1 jsonb [{queue, max_attempts, group_on_dead}], one entry per queue, in queue order
    // (concurrent boots lock the same rows in the same order). Insert, or update what an earlier
    // boot recorded.
    recordQueueSettings: `INSERT INTO ${settings} AS s (queue, max_attempts, group_on_dead, updated_at)
SELECT i.queue, i.max_attempts, i.group_on_dead, now()
FROM jsonb_to_recordset($1::jsonb) AS i(queue text, max_attempts int, group_on_dead text)
ORDER BY i.queue
ON CONFLICT (queue) DO UPDATE
SET max_attempts = EXCLUDED.max_attempts, group_on_dead = EXCLUDED.group_on_dead, updated_at = EXCLUDED.updated_at`,

    // $1 jsonb [{queue, key}]
    findByIdempotencyKeys: `SELECT j.queue, j.idempotency_key, j.id::text AS id
FROM jsonb_to_recordset($1::jsonb) AS k(queue text, key text)
JOIN ${jobs} j ON j.queue = k.queue AND j.idempotency_key = k.key`,

    // $1 queue, $2 limit (units), $3 lease ms, $4 worker id, $5 group batch size.
    // Three ordered range reads, each stopping after $2 rows: the queue's due ungrouped ready rows
    // in claim order (jobs_claim_ix, which holds no delayed or grouped rows), its due ungrouped
    // delayed rows, oldest first (jobs_delayed_ix), and its claimable ordered groups
    // (groups_claim_ix: not held, not blocked, head due). The best $2 units of the three, in claim
    // order, are leased; the other due delayed rows read are promoted to ready in the same UPDATE.
    // One statement, because a data-modifying CTE's changes are invisible to the rest of its
    // statement: a promotion CTE followed by a select of ready rows would not see the promoted
    // ones. So a delayed job is claimable at the first claim after it is due, and the claim's cost
    // follows due work, never the delayed backlog nor the jobs queued behind a group's head.
    // MATERIALIZED keeps the planner from merging the candidate scans into the UPDATE, which
    // could lock and update more rows than LIMIT allows. SKIP LOCKED lets concurrent claimers
    // pass each other instead of queueing on the same rows.
    //
    // Ordered groups (seed 002): the group row is the only thing a claim locks for a group, and
    // skipping it (SKIP LOCKED) means "another session is claiming or changing this group", never
    // "this group has no head". The hold itself is a column (held_token), not a lock: it outlives
    // this transaction and ends with the transition that releases it. A chosen group leases its
    // head plus up to $5 - 1 following jobs, all with the group's token, stopping at the first job
    // not due; its first unfinished job must be the cached head, else nothing is leased (a stale
    // cache) and the group is left alone for a second, for a transition or the repair sweep to fix.
    claim: `WITH due_ready AS MATERIALIZED (
  SELECT id, priority, run_at FROM ${jobs}
  WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND run_at <= now()
  ORDER BY priority DESC, run_at, id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), due_delayed AS MATERIALIZED (
  SELECT id, priority, run_at FROM ${jobs}
  WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now()
  ORDER BY run_at, id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), due_groups AS MATERIALIZED (
  SELECT group_key, head_id AS id, head_priority AS priority, head_ready_at AS run_at FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND NOT waiting
    AND head_ready_at <= now()
  ORDER BY head_priority DESC, head_ready_at, head_id
  LIMIT $2
  FOR NO KEY UPDATE SKIP LOCKED
), due_waiting_groups AS MATERIALIZED (
  SELECT group_key, head_id AS id, head_priority AS priority, head_ready_at AS run_at FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND waiting
    AND head_ready_at <= now()
  ORDER BY head_ready_at, head_id
  LIMIT $2
  FOR NO KEY UPDATE SKIP LOCKED
), ranked AS MATERIALIZED (
  -- Ready rows and groups that lose their place are left as they are (no new row version).
  SELECT id, kind, group_key, row_number() OVER (ORDER BY priority DESC, run_at, id) <= $2 AS lease
  FROM (SELECT id, priority, run_at, 'ready' AS kind, NULL::varchar AS group_key FROM due_ready
        UNION ALL SELECT id, priority, run_at, 'delayed', NULL FROM due_delayed
        UNION ALL SELECT id, priority, run_at, 'group', group_key FROM due_groups
        UNION ALL SELECT id, priority, run_at, 'waiting group', group_key FROM due_waiting_groups) AS due
), chosen_groups AS MATERIALIZED (
  SELECT group_key, id AS head_id, gen_random_uuid() AS token FROM ranked
  WHERE kind IN ('group', 'waiting group') AND lease
), members AS MATERIALIZED (
  SELECT m.id, g.token FROM chosen_groups g
  CROSS JOIN LATERAL (
    SELECT b.id FROM (
      SELECT u.id,
             bool_and(u.state <> 'leased' AND u.run_at <= now()) OVER (ORDER BY u.id) AS runnable,
             first_value(u.id) OVER (ORDER BY u.id) AS first_id
      FROM (SELECT id, state, run_at FROM ${jobs}
            WHERE queue = $1 AND group_key = g.group_key AND state IN ('ready', 'delayed', 'leased')
            ORDER BY id
            LIMIT $5) AS u
    ) AS b
    -- A first unfinished job below the cached head committed late (a producer's transaction,
    -- or retryDead, open while the group was held): it is the rightful head, and the group row's
    -- lock makes the lease exclusive. One above it means a stale cache: nothing is leased.
    WHERE b.runnable AND b.first_id <= g.head_id
  ) AS m
), candidates AS MATERIALIZED (
  SELECT id, true AS lease, gen_random_uuid() AS token FROM ranked WHERE kind IN ('ready', 'delayed') AND lease
  UNION ALL
  SELECT id, false, NULL FROM ranked WHERE kind = 'delayed' AND NOT lease
  UNION ALL
  SELECT id, true, token FROM members
), updated AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN c.lease THEN 'leased' ELSE 'ready' END,
      claim_token = CASE WHEN c.lease THEN c.token ELSE j.claim_token END,
      attempts = CASE WHEN c.lease THEN j.attempts + 1 ELSE j.attempts END,
      lease_until = CASE WHEN c.lease THEN now() + $3::float8 * interval '1 millisecond' ELSE j.lease_until END,
      claimed_at = CASE WHEN c.lease THEN now() ELSE j.claimed_at END,
      worker_id = CASE WHEN c.lease THEN $4 ELSE j.worker_id END
  FROM candidates c
  WHERE j.id = c.id AND j.state IN ('ready', 'delayed')
  RETURNING c.lease, j.id, j.payload, j.priority, j.group_key, j.idempotency_key, j.attempts, j.max_attempts,
            j.claim_token, j.created_at, j.claimed_at, j.lease_until, j.trace_context
), held AS (
  -- Chosen groups are held (or, with a stale head, set aside for a second); due waiting groups
  -- that lost their place are promoted to the ordered index, as due delayed jobs are.
  UPDATE ${groups} AS g
  SET held_token = CASE WHEN c.chosen AND h.leased THEN c.token END,
      head_ready_at = CASE WHEN c.chosen AND NOT h.leased THEN now() + interval '1 second' ELSE g.head_ready_at END,
      waiting = c.chosen AND NOT h.leased,
      updated_at = now()
  FROM (SELECT group_key, head_id, token, true AS chosen FROM chosen_groups
        UNION ALL
        SELECT w.group_key, w.id, NULL, false FROM due_waiting_groups w
        WHERE w.group_key NOT IN (SELECT group_key FROM chosen_groups)) AS c
  CROSS JOIN LATERAL (SELECT c.token IN (SELECT claim_token FROM updated WHERE lease) AS leased) AS h
  WHERE g.queue = $1 AND g.group_key = c.group_key
)
SELECT id::text AS id, payload, priority, group_key, idempotency_key, attempts, max_attempts,
       claim_token::text AS claim_token,
       -- epoch milliseconds: far cheaper for the client to turn into Dates than timestamp text
       (extract(epoch FROM created_at) * 1000)::float8 AS created_ms,
       (extract(epoch FROM claimed_at) * 1000)::float8 AS claimed_ms,
       (extract(epoch FROM lease_until) * 1000)::float8 AS lease_until_ms, trace_context
FROM updated WHERE lease`,

    // $1 jsonb [{id, token, lease_ms, max_ms}]; the lease never runs past claimed_at + max_ms. Once
    // that cap has passed the lease cannot be renewed: the answer is no lease (lost), not 'ok'.
    heartbeat: `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(id bigint, token uuid, lease_ms float8, max_ms float8)
), extended AS (
  UPDATE ${jobs} AS j
  SET lease_until = CASE
    WHEN i.max_ms IS NULL THEN now() + i.lease_ms * interval '1 millisecond'
    ELSE LEAST(now() + i.lease_ms * interval '1 millisecond', j.claimed_at + i.max_ms * interval '1 millisecond')
  END
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.lease_until
)
SELECT input.id::text AS id, CASE WHEN extended.lease_until > now() THEN extended.lease_until END AS lease_until
FROM input LEFT JOIN extended ON extended.id = input.id`,

    // $1 jsonb [{id, token}]. The token stays on the done row, so a retried completion whose
    // first reply was lost is recognised ('already') instead of reported as lost.
    complete: `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(id bigint, token uuid)
), completed AS (
  UPDATE ${jobs} AS j
  SET state = 'done', finished_at = now(), lease_until = NULL
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.queue, j.group_key, i.token, j.state, j.run_at, j.priority, false AS block
)${groupRelease('completed')}
SELECT input.id::text AS id,
  CASE WHEN completed.id IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${jobs} d WHERE d.id = input.id AND d.claim_token = input.token AND d.state = 'done') THEN 'already'
       ELSE 'lost' END AS outcome,
  ${EMPTIED_GROUPS}
FROM input LEFT JOIN completed ON completed.id = input.id`,

    // $1 jsonb [{id, token, error, stack, delay_ms, dead, worker}]. A retry that is not due yet
    // waits as 'delayed' (out of the claim's ready index); the claim promotes it once due.
    // A grouped job's batch siblings (leased with the same token, not run yet) go back to ready
    // with their attempt given back, and its group is released: the failed job stays its head.
    fail: `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb)
    AS i(id bigint, token uuid, error text, stack text, delay_ms float8, dead boolean, worker text)
), failed AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN i.dead OR j.attempts >= j.max_attempts THEN 'dead'
                   WHEN i.delay_ms > 0 THEN 'delayed' ELSE 'ready' END,
      run_at = CASE WHEN i.dead OR j.attempts >= j.max_attempts THEN j.run_at
                    ELSE now() + i.delay_ms * interval '1 millisecond' END,
      finished_at = CASE WHEN i.dead OR j.attempts >= j.max_attempts THEN now() END,
      claim_token = NULL, lease_until = NULL, last_error = i.error
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.queue, j.group_key, j.state, j.attempts, j.claimed_at, j.run_at, j.priority,
            i.token, i.error, i.stack, i.worker
), ${siblingsBack('failed')}, changed AS (
  SELECT f.id, f.queue, f.group_key, f.token, f.state, f.run_at, f.priority,
         f.state = 'dead' AND f.group_key IS NOT NULL AND ${blocksOnDead('f.queue')} AS block
  FROM failed f
  UNION ALL
  SELECT id, queue, group_key, token, state, run_at, priority, false FROM siblings
)${groupRelease('changed')}, history AS (
  INSERT INTO ${attempts} (job_id, queue, attempt, outcome, error, stack, worker_id, claim_token, started_at, finished_at)
  SELECT id, queue, attempts, 'failed', error, stack, worker, token, claimed_at, now() FROM failed
)
SELECT input.id::text AS id, failed.state,
  CASE WHEN failed.id IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${attempts} a WHERE a.job_id = input.id AND a.claim_token = input.token AND a.outcome = 'failed') THEN 'already'
       ELSE 'lost' END AS outcome,
  ${EMPTIED_GROUPS}
FROM input LEFT JOIN failed ON failed.id = input.id`,

    // $1 jsonb [{id, token}]: leased but never started; the claim's attempt is given back.
    release: `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(id bigint, token uuid)
), released AS (
  UPDATE ${jobs} AS j
  SET state = 'ready', attempts = GREATEST(j.attempts - 1, 0), claim_token = NULL, lease_until = NULL,
      claimed_at = NULL, worker_id = NULL
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.queue, j.group_key, i.token, j.state, j.run_at, j.priority, false AS block
)${groupRelease('released')}
SELECT input.id::text AS id, CASE WHEN released.id IS NOT NULL THEN 'ok' ELSE 'lost' END AS outcome,
  ${EMPTIED_GROUPS}
FROM input LEFT JOIN released ON released.id = input.id`,

    // $1 batch size. One conditional statement: lock expired leases (skipping rows another
    // reaper holds), re-check under the lock, void the token, record the lost attempt.
    // run_at stays as it was: the job keeps its place, and its waiting age keeps counting.
    // A grouped job's batch siblings (leased with the same token) are reaped with it, whatever
    // their own lease says: the token is void, so its holder cannot go on with any of them. The
    // ones that never started get their attempt back and record none.
    reap: `WITH expired_leases AS MATERIALIZED (
  SELECT id, queue, group_key, claim_token FROM ${jobs}
  WHERE state = 'leased' AND lease_until < now()
  ORDER BY lease_until
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), expired AS MATERIALIZED (
  -- A group batch runs in id order, so of its jobs still leased only the lowest can have
  -- started: the others never ran, and their attempt is given back (as a release would).
  SELECT x.id, x.claim_token, x.sibling,
         x.group_key IS NOT NULL AND x.id > min(x.id) OVER (PARTITION BY x.claim_token) AS unstarted
  FROM (
    SELECT id, claim_token, group_key, false AS sibling FROM expired_leases
    UNION
    SELECT s.id, s.claim_token, s.group_key, true FROM ${jobs} s
    WHERE s.claim_token = ANY (ARRAY(SELECT claim_token FROM expired_leases WHERE group_key IS NOT NULL))
      AND s.state = 'leased' AND s.group_key IS NOT NULL AND s.id NOT IN (SELECT id FROM expired_leases)
  ) AS x
), reaped AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN NOT e.unstarted AND j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
      attempts = CASE WHEN e.unstarted THEN GREATEST(j.attempts - 1, 0) ELSE j.attempts END,
      finished_at = CASE WHEN NOT e.unstarted AND j.attempts >= j.max_attempts THEN now() END,
      claim_token = NULL, lease_until = NULL,
      claimed_at = CASE WHEN e.unstarted THEN NULL ELSE j.claimed_at END,
      last_error = CASE WHEN e.unstarted THEN j.last_error
                   ELSE 'lease expired at ' || to_char(j.lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                        || ' (worker ' || COALESCE(j.worker_id, 'unknown') || ')' END
  FROM expired e
  WHERE j.id = e.id AND j.state = 'leased' AND j.claim_token = e.claim_token AND (e.sibling OR j.lease_until < now())
  RETURNING j.id, j.queue, j.group_key, j.state, j.attempts, j.last_error, j.run_at, j.priority,
            e.claim_token AS token, e.unstarted, j.worker_id, j.claimed_at
), changed AS (
  SELECT r.id, r.queue, r.group_key, r.token, r.state, r.run_at, r.priority,
         r.state = 'dead' AND r.group_key IS NOT NULL AND ${blocksOnDead('r.queue')} AS block
  FROM reaped r
)${groupRelease('changed')}, history AS (
  INSERT INTO ${attempts} (job_id, queue, attempt, outcome, error, stack, worker_id, claim_token, started_at, finished_at)
  SELECT id, queue, attempts, 'lease-expired', last_error, NULL, worker_id, token, claimed_at, now()
  FROM reaped WHERE NOT unstarted
)
SELECT id::text AS id, queue, state, attempts, ${EMPTIED_GROUPS},
  CASE WHEN row_number() OVER () = 1 THEN
    (SELECT json_agg(DISTINCT jsonb_build_object('queue', queue, 'key', group_key, 'token', token))
     FROM reaped WHERE group_key IS NOT NULL)
  END AS voided_holds
FROM reaped`,

    // ---- ordered groups ------------------------------------------------------------------

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
    touchLock: `WITH input AS MATERIALIZED (
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
LEFT JOIN created c ON c.group_key = i.key`,

    // $1 queue, $2 keys, $3 job ids: the groups touchLock locked, headed by the lowest new id of
    // each; $4 keys, $5 ids: every job retryDead moved back, since a blocked group is released
    // when its blocking job is one of them. A new statement, so its snapshot is younger than the
    // lock: it sees every transition committed before the lock, and one running now makes this
    // UPDATE wait and re-check (a decision taken on touchLock's older snapshot could miss a group
    // just emptied, and leave the job to a settling that had already passed). The head moves to
    // the job when the group is idle, or not held and headed by a later job (an earlier-numbered
    // job committing late), or blocked by a job just retried.
    touchMove: `UPDATE ${groups} AS g
SET head_id = i.id, head_ready_at = j.run_at, head_priority = j.priority, waiting = j.run_at > statement_timestamp(),
    blocked = false, updated_at = now()
FROM unnest($2::text[], $3::bigint[]) AS i(key, id)
CROSS JOIN LATERAL (SELECT run_at, priority FROM ${jobs} WHERE id = i.id LIMIT 1) AS j
WHERE g.queue = $1 AND g.group_key = ANY ($2::text[]) AND g.group_key = i.key AND g.held_token IS NULL
  AND ((NOT g.blocked AND (g.head_id IS NULL OR g.head_id > i.id))
       OR (g.blocked AND g.head_id IN (SELECT r.id FROM unnest($4::text[], $5::bigint[]) AS r(key, id)
                                       WHERE r.key = g.group_key)))`,

    // $1 queues, $2 keys, $3 tokens: groups whose token the reaper voided. A completion of
    // another job of the batch, running at the same time, may have kept the group held (it saw
    // the reaped job still leased) while the reaper, on its older snapshot, saw that completion's
    // job still leased too: neither let the group go. Run after the reap committed (which waited
    // for that completion), this sees both: a group still held by a token no job is leased with
    // is released, headed by its lowest unfinished job (none: emptied, settled as usual).
    releaseVoidHolds: `UPDATE ${groups} AS g
SET held_token = NULL,
    head_id = (SELECT u.id FROM (${firstUnfinishedRow('g')}) AS u),
    head_ready_at = (SELECT u.run_at FROM (${firstUnfinishedRow('g')}) AS u),
    head_priority = (SELECT u.priority FROM (${firstUnfinishedRow('g')}) AS u),
    waiting = COALESCE((SELECT u.run_at > now() FROM (${firstUnfinishedRow('g')}) AS u), false),
    updated_at = now()
FROM unnest($1::text[], $2::text[], $3::uuid[]) AS t(queue, key, token)
WHERE g.queue = t.queue AND g.group_key = t.key AND g.held_token = t.token
  AND NOT EXISTS (SELECT 1 FROM ${jobs} s WHERE s.claim_token = t.token AND s.state = 'leased' AND s.group_key IS NOT NULL)
RETURNING g.queue, g.group_key AS key, g.head_id IS NULL AS emptied`,

    // $1 queue, $2 keys: groups of the queue a transition emptied. Locks those still idle and
    // headless, skipping any a producer holds (its FOR KEY SHARE) or another session is settling.
    // One queue and an array of keys: a primary-key index condition, whatever the planner thinks
    // of how many groups are idle (its statistics see none, since none stays idle for long).
    settleLock: `WITH locked AS MATERIALIZED (
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
  AND group_key NOT IN (SELECT group_key FROM locked)`,

    // $1 queue, $2 keys: groups settleLock locked, read again in a new statement (a new
    // snapshot, which sees every producer that held them): the lowest unfinished job becomes the
    // head, and a group with none is deleted (producers create it again).
    settleApply: `WITH headed AS (
  UPDATE ${groups} AS g
  SET (head_id, head_ready_at, head_priority, waiting) = (${firstUnfinishedRow('g', 'u.run_at > now()')}),
      updated_at = now()
  WHERE g.queue = $1 AND g.group_key = ANY ($2::text[])
    AND g.head_id IS NULL AND g.held_token IS NULL AND NOT g.blocked AND EXISTS (${firstUnfinishedRow('g')})
)
DELETE FROM ${groups} AS g
WHERE g.queue = $1 AND g.group_key = ANY ($2::text[])
  AND g.head_id IS NULL AND g.held_token IS NULL AND NOT g.blocked AND NOT EXISTS (${firstUnfinishedRow('g')})`,

    // $1, $2 the last group row checked, $3, $4 the last group of jobs walked (nulls: from the
    // start), $5 page size. The repair sweep's look, without a lock: the next page of group rows
    // checked against their jobs (groupProblem), and the next page of distinct groups that have
    // unfinished jobs (a loose index scan on jobs_group_ix, one seek per group) checked for a
    // group row. Normally it finds nothing and is the sweep's only statement; what it finds is
    // checked again under a lock (repairLock, repairApply, repairOrphans) before anything is fixed,
    // since a transition may be between its statements right now. The last two rows say where
    // each page ended (null when it reached the end).
    repairCheck: `WITH RECURSIVE page AS MATERIALIZED (
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
${firstUnfinished('g')}
WHERE ${groupProblem('g', 'n')} IS NOT NULL OR (n.id IS NULL AND g.head_id IS NULL AND g.held_token IS NULL AND NOT g.blocked)
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
) AS last_group`,

    // $1 queues, $2 keys: suspects of repairCheck, locked so that no transition runs while they
    // are checked again; rows another session holds (a claim, a producer, a transition) are
    // skipped and looked at on a later pass.
    repairLock: `SELECT g.queue, g.group_key AS key FROM (SELECT * FROM ${GROUPS_IN} ORDER BY queue, key) AS i
CROSS JOIN LATERAL (
  SELECT queue, group_key FROM ${groups} WHERE queue = i.queue AND group_key = i.key FOR UPDATE SKIP LOCKED
) AS g`,

    // $1 queues, $2 keys locked by repairLock, read again in a new statement. The oracle is
    // the jobs table (groupProblem). A row that disagrees is set right (or deleted when the group
    // has no unfinished job) and returned with what was wrong; a headless row with no job left is
    // deleted silently (an emptied group whose settling was cut short), not reported.
    repairApply: `WITH checked AS MATERIALIZED (
  SELECT g.queue, g.group_key, g.head_id, g.held_token, g.blocked, n.id AS first_id, n.run_at, n.priority,
         ${groupProblem('g', 'n')} AS problem
  FROM ${GROUPS_IN}
  JOIN ${groups} g ON g.queue = i.queue AND g.group_key = i.key
  ${firstUnfinished('g')}
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
SELECT queue, group_key AS key, problem FROM checked WHERE problem IS NOT NULL`,

    // $1 queues, $2 keys: groups repairCheck found with unfinished jobs and no row. Producers
    // create the row in the transaction that adds the job, so a committed job without one is a
    // fault: the group gets a row headed by its lowest unfinished job.
    repairOrphans: `INSERT INTO ${groups} (queue, group_key, head_id, head_ready_at, head_priority, waiting)
SELECT i.queue, i.key, n.id, n.run_at, n.priority, n.run_at > now()
FROM ${GROUPS_IN}
${firstUnfinished('i', 'key')}
WHERE n.id IS NOT NULL
ORDER BY i.queue, i.key
ON CONFLICT (queue, group_key) DO NOTHING
RETURNING queue, group_key AS key, head_id::text AS head_id`,

    // $1 queue, $2 after key (or null), $3 limit
    listBlockedGroups: `SELECT g.group_key, g.head_id::text AS job_id, j.last_error, j.finished_at
FROM ${groups} g LEFT JOIN ${jobs} j ON j.id = g.head_id
WHERE g.queue = $1 AND g.blocked AND ($2::varchar IS NULL OR g.group_key > $2::varchar)
ORDER BY g.group_key
LIMIT $3`,

    // A due delayed job counts: the next claim promotes and takes it; so does a claimable group.
    hasClaimableWork: `SELECT EXISTS (
  SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND run_at <= now()
) OR EXISTS (
  SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now()
) OR EXISTS (
  SELECT 1 FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND NOT waiting
    AND head_ready_at <= now()
) OR EXISTS (
  SELECT 1 FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND waiting
    AND head_ready_at <= now()
) AS has_work`,

    // Each figure reads one partial index, so the cost follows live rows, not history. A delayed
    // job that is due but not promoted yet (no claim since) counts as ready: it is waiting. Ready
    // rows not due yet only exist if written by a version before 3 (the migration moved them).
    // Grouped jobs waiting behind their group's head count as ready or delayed by their run time,
    // as the ones a claim can take do.
    stats: `WITH grouped AS (
  SELECT count(*) FILTER (WHERE state IN ('ready', 'delayed') AND run_at <= now())::int AS ready,
         count(*) FILTER (WHERE state IN ('ready', 'delayed') AND run_at > now())::int AS delayed,
         count(*) FILTER (WHERE state IN ('ready', 'delayed') AND attempts > 0)::int AS retrying,
         min(run_at) FILTER (WHERE state IN ('ready', 'delayed') AND run_at <= now()) AS oldest_due
  FROM ${jobs} WHERE queue = $1 AND group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased')
)
SELECT
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND run_at <= now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now())
  + (SELECT ready FROM grouped) AS ready,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at > now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND run_at > now())
  + (SELECT delayed FROM grouped) AS delayed,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'leased') AS leased,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'leased' AND lease_until < now()) AS expired_leases,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'dead') AS dead,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND attempts > 0)
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND attempts > 0)
  + (SELECT retrying FROM grouped) AS retrying,
  (SELECT count(*)::int FROM ${groups} WHERE queue = $1 AND blocked) AS blocked_groups,
  (SELECT floor(extract(epoch FROM now() - min(run_at)) * 1000)::float8 FROM (
     (SELECT run_at FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND run_at <= now() ORDER BY run_at LIMIT 1)
     UNION ALL
     (SELECT run_at FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now() ORDER BY run_at LIMIT 1)
     UNION ALL
     (SELECT oldest_due FROM grouped)
   ) AS oldest) AS oldest_ready_age_ms`,

    getJob: `SELECT ${JOB_COLUMNS} FROM ${jobs} WHERE id = $1`,

    getAttempts: `SELECT attempt, outcome, error, stack, worker_id, started_at, finished_at
FROM ${attempts} WHERE job_id = $1
UNION ALL
SELECT attempts, 'completed', NULL, NULL, worker_id, claimed_at, finished_at
FROM ${jobs} WHERE id = $1 AND state = 'done'
ORDER BY finished_at, attempt`,

    // $1 queue, $2 after id (or null), $3 limit
    // ORDER BY names the table's column: the select list's `id` is text and would sort 10 before 9.
    listDead: `SELECT ${JOB_COLUMNS} FROM ${jobs} AS j
WHERE j.queue = $1 AND j.state = 'dead' AND j.id > COALESCE($2::bigint, 0)
ORDER BY j.id
LIMIT $3`,

    // $1 queue, $2 jsonb array of ids. A retried job of an ordered group takes its place by id
    // through touchGroups, in the same transaction.
    retryDead: `UPDATE ${jobs}
SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL
WHERE queue = $1 AND state = 'dead' AND id IN (SELECT value::bigint FROM jsonb_array_elements_text($2::jsonb))
RETURNING id::text AS id, group_key`,

    retryAllDead: `UPDATE ${jobs}
SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL
WHERE queue = $1 AND state = 'dead'
RETURNING id::text AS id, group_key`,

    // $1 queue, $2 older-than ms (0 for all), $3 batch size, $4 bigint[] of the ids to purge (null:
    // every one). Run plain, so it is planned with its values: the null test folds away and the
    // ids, when given, are a condition on jobs_dead_ix (queue, id). The rows are locked where they are
    // chosen: FOR UPDATE re-checks the conditions on a row another statement changed (a dead job
    // retryDead moved back to ready is no longer chosen), and SKIP LOCKED never waits on one.
    // A group blocked by a purged job is released: its head becomes its lowest unfinished job
    // (none: emptied, settled by the store as after a completion).
    purgeDead: `WITH purged AS (
  DELETE FROM ${jobs} WHERE id IN (
    SELECT id FROM ${jobs}
    WHERE queue = $1 AND state = 'dead' AND finished_at <= now() - $2::float8 * interval '1 millisecond'
      AND ($4::bigint[] IS NULL OR id = ANY ($4::bigint[]))
    ORDER BY id LIMIT $3
    FOR UPDATE SKIP LOCKED
  )
  RETURNING id, queue, group_key
), group_released AS (
  UPDATE ${groups} AS g
  SET blocked = false, head_id = n.id, head_ready_at = n.run_at, head_priority = n.priority,
      waiting = COALESCE(n.run_at > now(), false), updated_at = now()
  FROM purged p
  ${firstUnfinished('p')}
  WHERE p.group_key IS NOT NULL AND g.queue = p.queue AND g.group_key = p.group_key AND g.blocked AND g.head_id = p.id
  RETURNING g.queue, g.group_key, g.head_id IS NULL AS emptied
)
SELECT (SELECT count(*) FROM purged)::int AS deleted, ${EMPTIED_GROUPS}`,

    // $1 done retention ms, $2 idempotency retention ms, $3 dead retention ms (null: keep), $4 batch.
    // A dead job that blocks its ordered group stays until it is retried or purged: deleting it
    // would leave the group blocked by nothing.
    // The outer conditions re-check, after a row lock wait, that the row is still finished (a
    // retried dead job is ready again; finished_at is cleared then). FOR UPDATE SKIP LOCKED, as
    // in purgeDead, is not allowed in the branches of a UNION.
    cleanup: `DELETE FROM ${jobs} WHERE id IN (
  (SELECT id FROM ${jobs}
   WHERE state = 'done' AND finished_at < now() - $1::float8 * interval '1 millisecond'
     AND (idempotency_key IS NULL
          OR finished_at < now() - GREATEST($1::float8, $2::float8) * interval '1 millisecond')
   ORDER BY finished_at LIMIT $4)
  UNION ALL
  (SELECT id FROM ${jobs} d
   WHERE $3::float8 IS NOT NULL AND state = 'dead'
     AND finished_at < now() - $3::float8 * interval '1 millisecond'
     AND (idempotency_key IS NULL
          OR finished_at < now() - GREATEST($3::float8, $2::float8) * interval '1 millisecond')
     AND (group_key IS NULL OR NOT EXISTS (
       SELECT 1 FROM ${groups} g WHERE g.queue = d.queue AND g.group_key = d.group_key AND g.blocked AND g.head_id = d.id))
   ORDER BY finished_at LIMIT $4)
) AND (state = 'done' OR (state = 'dead' AND $3::float8 IS NOT NULL))
  AND finished_at < now() - LEAST($1::float8, COALESCE($3::float8, $1::float8)) * interval '1 millisecond'`,

    // ---- browsing jobs and counting outcomes (the dashboard) -----------------------------------

    // Each listing selects its page of ids through the partial index that already serves the
    // state, by keyset ("after the last job listed", never OFFSET), then reads the summary of those
    // rows only: previews are cut here, so a page never carries whole payloads. Every one takes $1
    // queue, $2 rows (the page and one more, which tells whether a next page exists), $3 preview
    // characters, then the position after which the page starts. A first page passes a position
    // before every job, and a page in the grouped part one after every ungrouped job, so each
    // statement has one shape and no condition on which page it is.

    // $4 priority (bigint, so 2^31 stands before every job), $5 run_at, $6 id: the ungrouped
    // position; $7 group_key, $8 id: the grouped one. The ungrouped part is claim order on
    // jobs_claim_ix: the rest of the position's priority, then the lower priorities.
    listReadyJobs: readyOrDelayedPage(
      jobs,
      'ready',
      `SELECT id, 0 AS part, priority, run_at, NULL::varchar AS group_key FROM (
    (SELECT id, priority, run_at FROM ${jobs}
     WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND priority = $4::bigint
       AND (run_at, id) > ($5::timestamptz, $6::bigint)
     ORDER BY run_at, id LIMIT $2)
    UNION ALL
    (SELECT id, priority, run_at FROM ${jobs}
     WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND priority < $4::bigint
     ORDER BY priority DESC, run_at, id LIMIT $2)
  ) AS u
  ORDER BY priority DESC, run_at, id LIMIT $2`,
      'p.priority DESC, p.run_at',
      7,
    ),

    // $4 run_at, $5 id: the ungrouped position ('infinity' once in the grouped part), on
    // jobs_delayed_ix; $6 group_key, $7 id: the grouped one.
    listDelayedJobs: readyOrDelayedPage(
      jobs,
      'delayed',
      `SELECT id, 0 AS part, NULL::int AS priority, run_at, NULL::varchar AS group_key FROM ${jobs}
  WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND (run_at, id) > ($4::timestamptz, $5::bigint)
  ORDER BY run_at, id LIMIT $2`,
      'p.run_at',
      6,
    ),

    // $4 lease_until, $5 id. jobs_leased_ix holds (queue, lease_until): the position bounds the
    // index range and ties on lease_until are put in id order (few: leased jobs are running ones).
    listLeasedJobs: `SELECT ${summaryColumns('lease_until')}
FROM (
  SELECT id, lease_until FROM ${jobs}
  WHERE queue = $1 AND state = 'leased' AND (lease_until, id) > ($4::timestamptz, $5::bigint)
  ORDER BY lease_until, id LIMIT $2
) AS p
JOIN ${jobs} j ON j.id = p.id
ORDER BY p.lease_until, p.id`,

    // $4 finished_at, $5 id ('infinity' for the first page), $6 how many completions to look
    // through. Done rows are indexed by finish time only (jobs_done_ix, of all queues), so the
    // look-up walks the $6 most recent completions, newest first, and keeps the queue's: its
    // cost is bounded whatever the history holds. `scanned` (on every row, and on the one row
    // with no job when the page is empty) tells whether the walk reached its bound.
    listDoneJobs: `WITH recent AS MATERIALIZED (
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
ORDER BY page.sort_time DESC, page.sort_id DESC`,

    // $4 id: the page holds ids up to it (the last one listed minus one; the largest bigint first).
    listDeadJobs: `SELECT ${summaryColumns('finished_at')}
FROM (
  SELECT id FROM ${jobs}
  WHERE queue = $1 AND state = 'dead' AND id <= $4::bigint
  ORDER BY id DESC LIMIT $2
) AS p
JOIN ${jobs} j ON j.id = p.id
ORDER BY p.id DESC`,

    // $1 queues (one entry each, in any order), $2 completed, $3 failed, $4 dead. Upsert-adds into
    // each queue's bucket of the current minute (the database clock; now() is the statement's
    // time in autocommit). A concurrent first insert of the same bucket makes this one wait and
    // add instead; rows go in queue order, so two flushes lock their buckets in one order and
    // never deadlock.
    recordThroughput: `INSERT INTO ${throughput} AS t (minute, queue, completed, failed, dead)
SELECT date_trunc('minute', now(), 'UTC'), c.queue, c.completed, c.failed, c.dead
FROM unnest($1::varchar[], $2::bigint[], $3::bigint[], $4::bigint[]) AS c(queue, completed, failed, dead)
ORDER BY c.queue
ON CONFLICT (minute, queue) DO UPDATE
SET completed = t.completed + EXCLUDED.completed, failed = t.failed + EXCLUDED.failed, dead = t.dead + EXCLUDED.dead`,

    // $1 minutes: the buckets of the last $1 minutes, the current one included, oldest first, as
    // one range of throughput_pk; one row with no bucket when there are none, for the clock.
    readThroughput: `SELECT now() AS now, b.minute, b.queue, b.completed, b.failed, b.dead
FROM (VALUES (1)) AS one (x)
LEFT JOIN (
  SELECT minute, queue, completed::float8 AS completed, failed::float8 AS failed, dead::float8 AS dead
  FROM ${throughput}
  WHERE minute >= date_trunc('minute', now(), 'UTC') - ($1::int - 1) * interval '1 minute'
) AS b ON true
ORDER BY b.minute, b.queue`,

    // $1 retention ms, $2 batch size: the oldest buckets past the retention, one key range.
    cleanupThroughput: `DELETE FROM ${throughput} WHERE (minute, queue) IN (
  SELECT minute, queue FROM ${throughput}
  WHERE minute < now() - $1::float8 * interval '1 millisecond'
  ORDER BY minute LIMIT $2
)`,

    // A wake-up is only a hint: its transaction need not wait for a WAL flush (is_local: this
    // statement's own transaction only).
    notify: `SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)`,

    // ---- health and measurements --------------------------------------------------------

    // For the rest of the transaction (is_local): a monitoring read runs serially and without
    // JIT. With a large backlog its estimated cost crosses jit_above_cost and the parallel
    // thresholds, and on 100k ready jobs JIT compilation plus parallel workers made it 7×
    // slower (190 ms instead of 27 ms) while taking CPU from the database mid-incident.
    monitoringSettings: `SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)`,

    // $1 failure window ms, $2 repeated-failure threshold. Every queue in one statement, for
    // scrapes: each live figure reads one partial index (ready, leased, dead), so done rows are
    // never touched. The attempts table has no index on finished_at alone, so its queues are
    // walked on (queue, finished_at) with a recursive "loose index scan" (one seek per queue),
    // and each queue's recent attempts are one range seek on the same index.
    // Waiting jobs (ready and delayed) count as ready when due, delayed when not, as in stats.
    // Failures: a waiting job has failed `attempts` times; a leased one `attempts - 1` times.
    queueHealth: `WITH ready AS (
  SELECT queue,
         count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS delayed,
         count(*) FILTER (WHERE attempts > 0) AS retrying,
         count(*) FILTER (WHERE attempts >= $2::int) AS repeated,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due
  FROM (SELECT queue, run_at, attempts FROM ${jobs} WHERE state = 'ready' AND group_key IS NULL
        UNION ALL
        SELECT queue, run_at, attempts FROM ${jobs} WHERE state = 'delayed' AND group_key IS NULL
        UNION ALL
        SELECT queue, run_at, attempts FROM ${jobs}
        WHERE group_key IS NOT NULL AND state IN ('ready', 'delayed')) AS waiting
  GROUP BY queue
), leased AS (
  SELECT queue, count(*) AS leased, count(*) FILTER (WHERE lease_until < now()) AS expired_leases,
         count(*) FILTER (WHERE attempts > $2::int) AS repeated
  FROM ${jobs} WHERE state = 'leased' GROUP BY queue
), dead AS (
  SELECT queue, count(*) AS dead FROM ${jobs} WHERE state = 'dead' GROUP BY queue
), blocked AS (
  SELECT queue, count(*) AS blocked_groups FROM ${groups} WHERE blocked GROUP BY queue
), attempt_queues AS (
  WITH RECURSIVE walk AS (
    (SELECT queue FROM ${attempts} ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT a.queue FROM ${attempts} a WHERE a.queue > walk.queue ORDER BY a.queue LIMIT 1)
    FROM walk WHERE walk.queue IS NOT NULL
  )
  SELECT queue FROM walk WHERE queue IS NOT NULL
), failures AS (
  SELECT q.queue, f.failed, f.lease_expired
  FROM attempt_queues q
  CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE a.outcome = 'failed') AS failed,
           count(*) FILTER (WHERE a.outcome = 'lease-expired') AS lease_expired
    FROM ${attempts} a
    WHERE a.queue = q.queue AND a.finished_at > now() - $1::float8 * interval '1 millisecond'
  ) f
  WHERE f.failed + f.lease_expired > 0
), queues AS (
  SELECT queue FROM ready UNION SELECT queue FROM leased UNION SELECT queue FROM dead UNION SELECT queue FROM failures
  UNION SELECT queue FROM blocked
)
SELECT q.queue,
       COALESCE(r.ready, 0)::float8 AS ready, COALESCE(r.delayed, 0)::float8 AS delayed,
       COALESCE(l.leased, 0)::float8 AS leased, COALESCE(l.expired_leases, 0)::float8 AS expired_leases,
       COALESCE(d.dead, 0)::float8 AS dead, COALESCE(r.retrying, 0)::float8 AS retrying,
       COALESCE(b.blocked_groups, 0)::float8 AS blocked_groups,
       (COALESCE(r.repeated, 0) + COALESCE(l.repeated, 0))::float8 AS repeatedly_failing,
       COALESCE(f.failed, 0)::float8 AS recent_failures, COALESCE(f.lease_expired, 0)::float8 AS recent_lease_expiries,
       COALESCE(floor(extract(epoch FROM now() - r.oldest_due) * 1000), 0)::float8 AS oldest_ready_age_ms
FROM queues q
LEFT JOIN ready r ON r.queue = q.queue
LEFT JOIN leased l ON l.queue = q.queue
LEFT JOIN dead d ON d.queue = q.queue
LEFT JOIN blocked b ON b.queue = q.queue
LEFT JOIN failures f ON f.queue = q.queue
ORDER BY q.queue`,

    // The scheduler's idle poll, one autocommit statement: the database's now, and the ms until
    // the earliest unpaused schedule is due (<= 0: due; null: none). min() reads one end of
    // schedules_due_ix. Rounded up, so a positive answer is never due yet.
    scheduleDueIn: `SELECT now() AS now,
       ceil(extract(epoch FROM (SELECT min(next_run_at) FROM ${schedules}
                                WHERE NOT paused AND next_run_at IS NOT NULL) - now()) * 1000)::float8 AS due_in_ms`,

    // $1 limit. In fireDueSchedules' transaction: locks the due schedules no other instance
    // holds, earliest first; a row another instance is firing is skipped, and one it fired
    // meanwhile is re-checked on its new next_run_at and left out. now() is the transaction's
    // time, the same in the advance that follows.
    scheduleLockDue: `SELECT ${SCHEDULE_COLUMNS}, now() AS db_now
FROM ${schedules}
WHERE NOT paused AND next_run_at IS NOT NULL AND next_run_at <= now()
ORDER BY next_run_at
LIMIT $1
FOR UPDATE SKIP LOCKED`,

    // $1 jsonb [{id, next_run_at, last_tick, fired}], the schedules locked by scheduleLockDue.
    // A firing that enqueued no job (every missed tick skipped) moves next_run_at only: the last
    // run and its tick are those of the last job enqueued.
    scheduleAdvance: `UPDATE ${schedules} AS s
SET next_run_at = u.next_run_at,
    last_run_at = CASE WHEN u.fired THEN now() ELSE s.last_run_at END,
    last_tick = CASE WHEN u.fired THEN u.last_tick ELSE s.last_tick END,
    updated_at = now()
FROM jsonb_to_recordset($1::jsonb) AS u(id text, next_run_at timestamptz, last_tick timestamptz, fired boolean)
WHERE s.id = u.id`,

    // $1 jsonb [{id, queue, cron, timezone, payload, options, catch_up, source, next_run_at}], one
    // entry per id, in id order (concurrent boots lock the same rows in the same order). The
    // primary key makes a concurrent insert of the same id wait, then update: one row. An existing
    // schedule keeps its next_run_at unless its cron or time zone changed, and its paused flag.
    scheduleUpsert: `INSERT INTO ${schedules} AS s (id, queue, cron, timezone, payload, options, catch_up, source, next_run_at,
  created_at, updated_at)
SELECT i.id, i.queue, i.cron, i.timezone, i.payload, i.options, i.catch_up, i.source, i.next_run_at, now(), now()
FROM jsonb_to_recordset($1::jsonb) AS i(id text, queue text, cron text, timezone text, payload text, options text,
  catch_up text, source text, next_run_at timestamptz)
ORDER BY i.id
ON CONFLICT (id) DO UPDATE
SET queue = EXCLUDED.queue, payload = EXCLUDED.payload, options = EXCLUDED.options, catch_up = EXCLUDED.catch_up,
    source = EXCLUDED.source,
    next_run_at = CASE WHEN s.cron IS DISTINCT FROM EXCLUDED.cron OR s.timezone IS DISTINCT FROM EXCLUDED.timezone
                       THEN EXCLUDED.next_run_at ELSE s.next_run_at END,
    cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, updated_at = EXCLUDED.updated_at`,

    // $1 source, $2 text[] ids to keep: deletes the other schedules of that source.
    schedulePrune: `DELETE FROM ${schedules} WHERE source = $1 AND NOT (id = ANY($2::text[]))`,

    // $1 id
    scheduleGet: `SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} WHERE id = $1`,

    scheduleList: `SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} ORDER BY id`,

    // $1 id
    scheduleDelete: `DELETE FROM ${schedules} WHERE id = $1 RETURNING id`,

    // $1 id, $2 paused, $3 next_run_at for a resume. Only a paused schedule that resumes takes
    // $3 (it does not catch up its paused period); pausing, or resuming one that runs, keeps the
    // time it has, so a tick due right now is not skipped.
    schedulePause: `UPDATE ${schedules}
SET next_run_at = CASE WHEN paused AND NOT $2::boolean THEN $3::timestamptz ELSE next_run_at END,
    paused = $2::boolean, updated_at = now()
WHERE id = $1
RETURNING id`,
  };
}
