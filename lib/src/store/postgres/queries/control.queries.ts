// Job control: pausing and resuming queues, canceling jobs.
import { EMPTIED_GROUPS, groupRelease } from './groups.queries.js';
import type { PgTables } from './tables.js';

// $1 queue, $2 reason. A row when this statement paused the queue; none when it was paused
// already (the first pause and its reason stay). A concurrent pause of the same queue waits for
// the first one's commit and then does nothing.
export function pauseQueue(t: PgTables): string {
  const { pauses } = t;
  return `INSERT INTO ${pauses} (queue, reason) VALUES ($1, $2)
ON CONFLICT (queue) DO NOTHING
RETURNING queue`;
}

// $1 queue. A row when the queue was paused.
export function resumeQueue(t: PgTables): string {
  const { pauses } = t;
  return `DELETE FROM ${pauses} WHERE queue = $1 RETURNING queue`;
}

export function listPausedQueues(t: PgTables): string {
  const { pauses } = t;
  return `SELECT queue, reason, paused_at FROM ${pauses} ORDER BY queue`;
}

// $1 bigint[] job ids. Run first in cancel's transaction: the ordered groups of the grouped
// ones are locked (waiting for a claim or transition that holds one), so no claim chooses such a
// group while its job is canceled, and the cancel never holds a job row while it waits for a
// group row (a claim that locked the group first would then wait for that job: a deadlock).
export function cancelLockGroups(t: PgTables): string {
  const { jobs, groups } = t;
  return `SELECT g.group_key FROM ${groups} g
WHERE (g.queue, g.group_key) IN (
  SELECT j.queue, j.group_key FROM ${jobs} j WHERE j.id = ANY ($1::bigint[]) AND j.group_key IS NOT NULL)
ORDER BY g.queue, g.group_key
FOR NO KEY UPDATE OF g`;
}

// $1 bigint[] job ids (distinct), $2 reason. A ready or delayed job becomes canceled; a leased one
// keeps running and is marked (the first request's time and reason stay), for its owner's
// heartbeat. The groups of the canceled jobs move on as after a completion (groupRelease: an
// unheld group whose head was canceled is headed by its next job; a held or blocked one is left
// to its holder or its dead job). A job already finished is reported with its state, unchanged.
export function cancel(t: PgTables): string {
  const { jobs } = t;
  return `WITH canceled AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN j.state = 'leased' THEN 'leased' ELSE 'canceled' END,
      finished_at = CASE WHEN j.state = 'leased' THEN j.finished_at ELSE now() END,
      cancel_requested_at = COALESCE(j.cancel_requested_at, now()),
      cancel_reason = CASE WHEN j.cancel_requested_at IS NULL THEN $2 ELSE j.cancel_reason END
  WHERE j.id = ANY ($1::bigint[]) AND j.state IN ('ready', 'delayed', 'leased')
  RETURNING j.id, j.queue, j.group_key, NULL::uuid AS token, j.state, j.run_at, j.priority, false AS block
), released AS (
  SELECT * FROM canceled WHERE state = 'canceled'
)${groupRelease(t, 'released')}
SELECT i.id::text AS id,
  CASE WHEN c.state = 'canceled' THEN 'canceled' WHEN c.state = 'leased' THEN 'canceling'
       WHEN f.id IS NOT NULL THEN 'finished' ELSE 'missing' END AS outcome,
  COALESCE(c.state, CASE WHEN f.state IN ('done', 'dead', 'canceled') THEN f.state END) AS state,
  COALESCE(c.queue, f.queue) AS queue,
  ${EMPTIED_GROUPS}
FROM unnest($1::bigint[]) WITH ORDINALITY AS i(id, ord)
LEFT JOIN canceled c ON c.id = i.id
LEFT JOIN ${jobs} f ON f.id = i.id AND c.id IS NULL
ORDER BY i.ord`;
}

// $1 queue, $2 idempotency key: one seek on jobs_idempotency_ux.
export function findJobByKey(t: PgTables): string {
  const { jobs } = t;
  return `SELECT id::text AS id FROM ${jobs} WHERE queue = $1 AND idempotency_key = $2`;
}
