// Maintenance: the lease reaper, retention, dead-job retry and purge, throughput retention.
import { EMPTIED_GROUPS, firstUnfinished, groupRelease } from './groups.queries.js';
import { blocksOnDead } from './shared.js';
import type { PgTables } from './tables.js';

// $1 batch size. One conditional statement: lock expired leases (skipping rows another
// reaper holds), re-check under the lock, void the token, record the lost attempt.
// run_at stays as it was: the job keeps its place, and its waiting age keeps counting.
// A grouped job's batch siblings (leased with the same token) are reaped with it, whatever
// their own lease says: the token is void, so its holder cannot go on with any of them. The
// ones that never started get their attempt back and record none. A job cancel() marked is
// canceled, not retried: its owner died before it could record that.
export function reap(t: PgTables): string {
  const { jobs, attempts } = t;
  return `WITH expired_leases AS MATERIALIZED (
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
  SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'canceled'
                   WHEN NOT e.unstarted AND j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
      attempts = CASE WHEN e.unstarted THEN GREATEST(j.attempts - 1, 0) ELSE j.attempts END,
      finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR (NOT e.unstarted AND j.attempts >= j.max_attempts)
                         THEN now() END,
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
         r.state = 'dead' AND r.group_key IS NOT NULL AND ${blocksOnDead(t, 'r.queue')} AS block
  FROM reaped r
)${groupRelease(t, 'changed')}, history AS (
  INSERT INTO ${attempts} (job_id, queue, attempt, outcome, error, stack, worker_id, claim_token, started_at, finished_at)
  SELECT id, queue, attempts, 'lease-expired', last_error, NULL, worker_id, token, claimed_at, now()
  FROM reaped WHERE NOT unstarted
)
SELECT id::text AS id, queue, state, attempts, ${EMPTIED_GROUPS},
  CASE WHEN row_number() OVER () = 1 THEN
    (SELECT json_agg(DISTINCT jsonb_build_object('queue', queue, 'key', group_key, 'token', token))
     FROM reaped WHERE group_key IS NOT NULL)
  END AS voided_holds
FROM reaped`;
}

// $1 queue, $2 jsonb array of ids. A retried job of an ordered group takes its place by id
// through touchGroups, in the same transaction.
export function retryDead(t: PgTables): string {
  const { jobs } = t;
  return `UPDATE ${jobs}
SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL
WHERE queue = $1 AND state = 'dead' AND id IN (SELECT value::bigint FROM jsonb_array_elements_text($2::jsonb))
RETURNING id::text AS id, group_key`;
}

export function retryAllDead(t: PgTables): string {
  const { jobs } = t;
  return `UPDATE ${jobs}
SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL
WHERE queue = $1 AND state = 'dead'
RETURNING id::text AS id, group_key`;
}

// $1 queue, $2 older-than ms (0 for all), $3 batch size, $4 bigint[] of the ids to purge (null:
// every one). Run plain, so it is planned with its values: the null test folds away and the
// ids, when given, are a condition on jobs_dead_ix (queue, id). The rows are locked where they are
// chosen: FOR UPDATE re-checks the conditions on a row another statement changed (a dead job
// retryDead moved back to ready is no longer chosen), and SKIP LOCKED never waits on one.
// A group blocked by a purged job is released: its head becomes its lowest unfinished job
// (none: emptied, settled by the store as after a completion).
export function purgeDead(t: PgTables): string {
  const { jobs, groups } = t;
  return `WITH purged AS (
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
  ${firstUnfinished(t, 'p')}
  WHERE p.group_key IS NOT NULL AND g.queue = p.queue AND g.group_key = p.group_key AND g.blocked AND g.head_id = p.id
  RETURNING g.queue, g.group_key, g.head_id IS NULL AS emptied
)
SELECT (SELECT count(*) FROM purged)::int AS deleted, ${EMPTIED_GROUPS}`;
}

// $1 done retention ms, $2 idempotency retention ms, $3 dead retention ms (null: keep), $4 batch.
// Canceled jobs are kept as done ones are (jobs_canceled_ix).
// A dead job that blocks its ordered group stays until it is retried or purged: deleting it
// would leave the group blocked by nothing.
// The outer conditions re-check, after a row lock wait, that the row is still finished (a
// retried dead job is ready again; finished_at is cleared then). FOR UPDATE SKIP LOCKED, as
// in purgeDead, is not allowed in the branches of a UNION.
export function cleanup(t: PgTables): string {
  const { jobs, groups } = t;
  return `DELETE FROM ${jobs} WHERE id IN (
  (SELECT id FROM ${jobs}
   WHERE state = 'done' AND finished_at < now() - $1::float8 * interval '1 millisecond'
     AND (idempotency_key IS NULL
          OR finished_at < now() - GREATEST($1::float8, $2::float8) * interval '1 millisecond')
   ORDER BY finished_at LIMIT $4)
  UNION ALL
  (SELECT id FROM ${jobs}
   WHERE state = 'canceled' AND finished_at < now() - $1::float8 * interval '1 millisecond'
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
) AND (state IN ('done', 'canceled') OR (state = 'dead' AND $3::float8 IS NOT NULL))
  AND finished_at < now() - LEAST($1::float8, COALESCE($3::float8, $1::float8)) * interval '1 millisecond'`;
}

// $1 retention ms, $2 batch size: the oldest buckets past the retention, one key range.
export function cleanupThroughput(t: PgTables): string {
  const { throughput } = t;
  return `DELETE FROM ${throughput} WHERE (minute, queue) IN (
  SELECT minute, queue FROM ${throughput}
  WHERE minute < now() - $1::float8 * interval '1 millisecond'
  ORDER BY minute LIMIT $2
)`;
}
