// Claim and completion: the SKIP LOCKED claim (ungrouped and ordered groups), heartbeats, complete,
// fail and give-back, and the claimable-work probe.
import { EMPTIED_GROUPS, groupRelease } from './groups.queries.js';
import { blocksOnDead, notPaused } from './shared.js';
import type { PgTables } from './tables.js';

// Batch siblings of the grouped jobs in `moved` (leased with the same token, not in `moved`) go
// back to ready, their attempt given back: they never started. Found by their token alone
// (jobs_batch_ix): a token is drawn for one group batch.
function siblingsBack(t: PgTables, moved: string): string {
  const { jobs } = t;
  return `siblings AS (
  UPDATE ${jobs} AS j
  SET state = ${backOrCanceled('j')}, finished_at = ${canceledNow('j')},
      attempts = GREATEST(j.attempts - 1, 0), claim_token = NULL, lease_until = NULL, claimed_at = NULL, worker_id = NULL
  FROM unnest(ARRAY(SELECT DISTINCT token FROM ${moved} WHERE group_key IS NOT NULL)) AS m(token)
  WHERE j.claim_token = m.token AND j.state = 'leased' AND j.group_key IS NOT NULL
    AND j.id NOT IN (SELECT id FROM ${moved})
  RETURNING j.id, j.queue, j.group_key, m.token, j.state, j.run_at, j.priority
)`;
}

// The queue's consumers recorded flow limits (alias s: its queue_settings row).
const HAS_LIMITS = `(s.global_concurrency IS NOT NULL OR s.concurrency_per_key IS NOT NULL OR s.rate_max IS NOT NULL
  OR s.key_rate_max IS NOT NULL)`;

// A leased job cancel() marked never goes back to waiting: where it would (a failure to retry, a
// give-back, a batch sibling given back), it is canceled instead, final.
function backOrCanceled(j: string, back = "'ready'"): string {
  return `CASE WHEN ${j}.cancel_requested_at IS NOT NULL THEN 'canceled' ELSE ${back} END`;
}

function canceledNow(j: string): string {
  return `CASE WHEN ${j}.cancel_requested_at IS NOT NULL THEN now() END`;
}

// $1 queue, $2 limit (units), $3 lease ms, $4 worker id, $5 group batch size, $6 true for a flow
// claim: its leases are stamped with this statement's clock (taken after the flow lock and after
// the snapshot) instead of now(), the transaction's start.
// Jobs with a concurrency key are the flow claim's (flow.queries.ts): due delayed ones are
// promoted here too, never leased.
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
// pass each other instead of queueing on the same rows. A paused queue (queue_pauses) leases
// nothing: every scan is gated by the one probe of its pause row.
//
// Ordered groups (seed 002): the group row is the only thing a claim locks for a group, and
// skipping it (SKIP LOCKED) means "another session is claiming or changing this group", never
// "this group has no head". The hold itself is a column (held_token), not a lock: it outlives
// this transaction and ends with the transition that releases it. A chosen group leases its
// head plus up to $5 - 1 following jobs, all with the group's token, stopping at the first job
// not due; its first unfinished job must be the cached head, else nothing is leased (a stale
// cache) and the group is left alone for a second, for a transition or the repair sweep to fix.
export function claim(t: PgTables): string {
  const { jobs, groups, settings } = t;
  // Not the flow claim's lane, and the queue's consumers recorded limits: this statement leases
  // nothing, and its marker row hands the queue to the flow claim, which applies them (an
  // instance that booted without limits follows the ones recorded after it). One probe of
  // queue_settings' primary key, run once per statement, as the pause probe.
  const ordinaryClaim = `($6::boolean OR NOT EXISTS (SELECT 1 FROM ${settings} s WHERE s.queue = $1 AND ${HAS_LIMITS}))`;
  return `WITH stamp AS MATERIALIZED (
  SELECT CASE WHEN $6::boolean THEN clock_timestamp() ELSE now() END AS at
), due_ready AS MATERIALIZED (
  SELECT id, priority, run_at FROM ${jobs}
  WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now()
    AND ${notPaused(t, '$1')} AND ${ordinaryClaim}
  ORDER BY priority DESC, run_at, id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), due_delayed AS MATERIALIZED (
  SELECT id, priority, run_at, concurrency_key IS NOT NULL AS keyed FROM ${jobs}
  WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now() AND ${notPaused(t, '$1')} AND ${ordinaryClaim}
  ORDER BY run_at, id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), due_groups AS MATERIALIZED (
  SELECT group_key, head_id AS id, head_priority AS priority, head_ready_at AS run_at FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND NOT waiting
    AND head_ready_at <= now() AND ${notPaused(t, '$1')} AND ${ordinaryClaim}
  ORDER BY head_priority DESC, head_ready_at, head_id
  LIMIT $2
  FOR NO KEY UPDATE SKIP LOCKED
), due_waiting_groups AS MATERIALIZED (
  SELECT group_key, head_id AS id, head_priority AS priority, head_ready_at AS run_at FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND waiting
    AND head_ready_at <= now() AND ${notPaused(t, '$1')} AND ${ordinaryClaim}
  ORDER BY head_ready_at, head_id
  LIMIT $2
  FOR NO KEY UPDATE SKIP LOCKED
), ranked AS MATERIALIZED (
  -- Ready rows and groups that lose their place are left as they are (no new row version).
  SELECT id, kind, group_key, row_number() OVER (ORDER BY priority DESC, run_at, id) <= $2 AS lease
  FROM (SELECT id, priority, run_at, 'ready' AS kind, NULL::varchar AS group_key FROM due_ready
        UNION ALL SELECT id, priority, run_at, 'delayed', NULL FROM due_delayed WHERE NOT keyed
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
  SELECT id, false, NULL FROM due_delayed WHERE keyed
  UNION ALL
  SELECT id, true, token FROM members
), updated AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN c.lease THEN 'leased' ELSE 'ready' END,
      claim_token = CASE WHEN c.lease THEN c.token ELSE j.claim_token END,
      attempts = CASE WHEN c.lease THEN j.attempts + 1 ELSE j.attempts END,
      lease_until = CASE WHEN c.lease THEN (SELECT at FROM stamp) + $3::float8 * interval '1 millisecond'
                         ELSE j.lease_until END,
      claimed_at = CASE WHEN c.lease THEN (SELECT at FROM stamp) ELSE j.claimed_at END,
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
FROM updated WHERE lease
UNION ALL
-- Keyed ready jobs are not this statement's (they wait in jobs_key_ready_ix, outside its scans),
-- nor is a queue with recorded limits: a row without an id says so, and the store takes the
-- queue's flow claim from then on.
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE EXISTS (SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL)
   OR NOT ${ordinaryClaim}`;
}

// $1 jsonb [{id, token, lease_ms, max_ms, progress}] (progress: JSON text reported since the last
// write, or null: unchanged); the lease never runs past claimed_at + max_ms. Once
// that cap has passed the lease cannot be renewed: the answer is no lease (lost), not 'ok'. A job
// cancel() marked comes back with its cancel request: the lease is still renewed, so the job
// stays fenced while its owner records the cancellation.
export function heartbeat(t: PgTables): string {
  const { jobs } = t;
  return `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(id bigint, token uuid, lease_ms float8, max_ms float8, progress text)
), extended AS (
  UPDATE ${jobs} AS j
  SET progress = COALESCE(i.progress::jsonb, j.progress),
      lease_until = CASE
    WHEN i.max_ms IS NULL THEN now() + i.lease_ms * interval '1 millisecond'
    ELSE LEAST(now() + i.lease_ms * interval '1 millisecond', j.claimed_at + i.max_ms * interval '1 millisecond')
  END
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.lease_until, j.cancel_requested_at, j.cancel_reason
)
SELECT input.id::text AS id, CASE WHEN extended.lease_until > now() THEN extended.lease_until END AS lease_until,
       extended.cancel_requested_at IS NOT NULL AS cancel, extended.cancel_reason
FROM input LEFT JOIN extended ON extended.id = input.id`;
}

// $1 jsonb [{id, token, result, progress}] (result: the handler's return value as JSON text, or
// null; progress: its last report not written yet, or null). The
// token stays on the done row, so a retried completion whose first reply was lost is recognised
// ('already') instead of reported as lost.
export function complete(t: PgTables): string {
  const { jobs } = t;
  return `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(id bigint, token uuid, result text, progress text)
), completed AS (
  UPDATE ${jobs} AS j
  SET state = 'done', finished_at = now(), lease_until = NULL, result = i.result::jsonb,
      progress = COALESCE(i.progress::jsonb, j.progress)
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.queue, j.group_key, i.token, j.state, j.run_at, j.priority, false AS block
)${groupRelease(t, 'completed')}
SELECT input.id::text AS id,
  CASE WHEN completed.id IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${jobs} d WHERE d.id = input.id AND d.claim_token = input.token AND d.state = 'done') THEN 'already'
       ELSE 'lost' END AS outcome,
  ${EMPTIED_GROUPS}
FROM input LEFT JOIN completed ON completed.id = input.id`;
}

// $1 jsonb [{id, token, error, stack, delay_ms, dead, worker, canceled}]. A retry that is not due
// yet waits as 'delayed' (out of the claim's ready index); the claim promotes it once due. An
// acknowledged cancellation (canceled) makes the job 'canceled', final, its attempt 'canceled'.
// A grouped job's batch siblings (leased with the same token, not run yet) go back to ready
// with their attempt given back, and its group is released: the failed job stays its head.
export function fail(t: PgTables): string {
  const { jobs, attempts } = t;
  return `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb)
    AS i(id bigint, token uuid, error text, stack text, delay_ms float8, dead boolean, worker text, canceled boolean)
), failed AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN i.canceled OR j.cancel_requested_at IS NOT NULL THEN 'canceled'
                   WHEN i.dead OR j.attempts >= j.max_attempts THEN 'dead'
                   WHEN i.delay_ms > 0 THEN 'delayed' ELSE 'ready' END,
      run_at = CASE WHEN i.canceled OR j.cancel_requested_at IS NOT NULL OR i.dead OR j.attempts >= j.max_attempts
                    THEN j.run_at ELSE now() + i.delay_ms * interval '1 millisecond' END,
      finished_at = CASE WHEN i.canceled OR j.cancel_requested_at IS NOT NULL OR i.dead OR j.attempts >= j.max_attempts
                         THEN now() END,
      claim_token = NULL, lease_until = NULL, last_error = i.error
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.queue, j.group_key, j.state, j.attempts, j.claimed_at, j.run_at, j.priority,
            i.token, i.error, i.stack, i.worker, i.canceled IS TRUE AS acknowledged
), ${siblingsBack(t, 'failed')}, changed AS (
  SELECT f.id, f.queue, f.group_key, f.token, f.state, f.run_at, f.priority,
         f.state = 'dead' AND f.group_key IS NOT NULL AND ${blocksOnDead(t, 'f.queue')} AS block
  FROM failed f
  UNION ALL
  SELECT id, queue, group_key, token, state, run_at, priority, false FROM siblings
)${groupRelease(t, 'changed')}, history AS (
  INSERT INTO ${attempts} (job_id, queue, attempt, outcome, error, stack, worker_id, claim_token, started_at, finished_at)
  SELECT id, queue, attempts, CASE WHEN acknowledged THEN 'canceled' ELSE 'failed' END, error, stack, worker, token,
         claimed_at, now()
  FROM failed
)
SELECT input.id::text AS id, failed.state,
  CASE WHEN failed.id IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${attempts} a
                    WHERE a.job_id = input.id AND a.claim_token = input.token AND a.outcome IN ('failed', 'canceled')) THEN 'already'
       ELSE 'lost' END AS outcome,
  ${EMPTIED_GROUPS}
FROM input LEFT JOIN failed ON failed.id = input.id`;
}

// $1 jsonb [{id, token, delay_ms}]: the claim's attempt is given back. Leased but never started
// (delay_ms 0 or absent): ready at once, in its old place. Postponed by its handler (delay_ms > 0):
// delayed until then; the claim promotes it once due, and its group waits for it.
export function release(t: PgTables): string {
  const { jobs, flowState, settings } = t;
  return `WITH input AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(id bigint, token uuid, delay_ms float8)
), released AS (
  UPDATE ${jobs} AS j
  SET state = ${backOrCanceled('j', "CASE WHEN i.delay_ms > 0 THEN 'delayed' ELSE 'ready' END")},
      run_at = CASE WHEN j.cancel_requested_at IS NULL AND i.delay_ms > 0
                    THEN now() + i.delay_ms * interval '1 millisecond' ELSE j.run_at END,
      finished_at = ${canceledNow('j')},
      attempts = GREATEST(j.attempts - 1, 0), claim_token = NULL, lease_until = NULL, claimed_at = NULL, worker_id = NULL
  FROM input i
  WHERE j.id = i.id AND j.claim_token = i.token AND j.state = 'leased'
  RETURNING j.id, j.queue, j.group_key, i.token, j.state, j.run_at, j.priority, false AS block, j.concurrency_key
), key_waits AS (
  -- Under rateLimitPerKey a postponed job's whole key waits (the outside limit is the key's):
  -- flow claims skip the key until then.
  INSERT INTO ${flowState} AS f (queue, lane, blocked_until)
  SELECT r.queue, r.concurrency_key, max(r.run_at) FROM released r
  WHERE r.concurrency_key IS NOT NULL AND r.state = 'delayed'
    AND EXISTS (SELECT 1 FROM ${settings} s WHERE s.queue = r.queue AND s.key_rate_max IS NOT NULL)
  GROUP BY r.queue, r.concurrency_key
  ORDER BY r.queue, r.concurrency_key
  ON CONFLICT (queue, lane) DO UPDATE SET blocked_until = GREATEST(f.blocked_until, EXCLUDED.blocked_until)
)${groupRelease(t, 'released')}
SELECT input.id::text AS id, CASE WHEN released.id IS NOT NULL THEN 'ok' ELSE 'lost' END AS outcome,
  ${EMPTIED_GROUPS}
FROM input LEFT JOIN released ON released.id = input.id`;
}

// A due delayed job counts: the next claim promotes and takes it; so does a claimable group.
export function hasClaimableWork(t: PgTables): string {
  const { jobs, groups } = t;
  return `SELECT (EXISTS (
  SELECT 1 FROM ${jobs}
  WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now()
) OR EXISTS (
  SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now()
) OR EXISTS (
  SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL
) OR EXISTS (
  SELECT 1 FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND NOT waiting
    AND head_ready_at <= now()
) OR EXISTS (
  SELECT 1 FROM ${groups}
  WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND waiting
    AND head_ready_at <= now()
)) AND ${notPaused(t, '$1')} AS has_work`;
}
