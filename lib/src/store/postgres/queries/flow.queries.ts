// Flow control (issue 24): the claim of a queue with limits or concurrency keys. It runs as one
// transaction of a few statements on one connection:
//   1. flowLock: the queue's flow_state row, FOR UPDATE. Every flow claim of the queue waits for
//      it (a short wait, never a skip that would read as "no work"), so flow claims of a queue
//      take turns across all instances: only one of them counts and leases at a time.
//   2. flowBudget: in a new statement (READ COMMITTED: a new snapshot, taken after the lock, so
//      it sees everything the previous holder committed), the recorded limits, the leased count,
//      the starts in the rate window, and what kinds of work wait.
//   3. the ordinary claim for the queue's jobs without a key (and its ordered groups), limited to
//      their share of the budget;
//   4. flowLease: keyed jobs, keys in turn from the cursor, each within its slots and its rate
//      window, then the cursor and the starts recorded.
// A slot is a leased row (counted on jobs_key_leased_ix, or jobs_leased_ix for the queue), not a
// counter: a lease that ends in any way (completion, failure, give-back, cancel, the reaper after
// a crash) frees its slot with it, and nothing can drift.
import { notPaused } from './shared.js';
import type { PgTables } from './tables.js';

// $1 queue. Nothing comes back when the queue has no flow_state row yet (flowLockCreate makes it).
export function flowLock(t: PgTables): string {
  const { flowState } = t;
  return `SELECT 1 AS locked FROM ${flowState} WHERE queue = $1 AND lane = '' FOR UPDATE`;
}

// $1 queue: the first flow claim of a queue creates its row; concurrent ones meet at the key.
export function flowLockCreate(t: PgTables): string {
  const { flowState } = t;
  return `INSERT INTO ${flowState} (queue, lane) VALUES ($1, '') ON CONFLICT (queue, lane) DO NOTHING`;
}

// $1 queue. Due delayed keyed jobs become ready here, in a statement before the lease, so the
// lease sees them. `at` is the time every start of this claim is counted at (and its claimed_at):
// taken after the lock, so the starts of successive claims of a queue are in time order.
export function flowBudget(t: PgTables): string {
  const { jobs, settings, flowState, groups } = t;
  return `WITH promoted AS (
  UPDATE ${jobs} SET state = 'ready'
  WHERE id IN (SELECT id FROM ${jobs}
               WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND concurrency_key IS NOT NULL AND run_at <= now()
               ORDER BY run_at, id LIMIT 1000
               FOR UPDATE SKIP LOCKED)
  RETURNING 1
)
SELECT c.at, s.global_concurrency, s.concurrency_per_key, s.rate_max, s.rate_per_ms, s.key_rate_max, s.key_rate_per_ms,
  CASE WHEN s.global_concurrency IS NOT NULL
       THEN (SELECT count(*) FROM ${jobs} WHERE queue = $1 AND state = 'leased') END::int AS running,
  CASE WHEN s.rate_max IS NOT NULL
       THEN (SELECT count(*) FROM unnest(f.starts) AS st WHERE st > c.at - s.rate_per_ms * interval '1 millisecond') END::int
    AS recent_starts,
  -- When the window is full: how soon its oldest start leaves it (the readers' next try).
  (SELECT ceil(extract(epoch FROM min(st) + s.rate_per_ms * interval '1 millisecond' - c.at) * 1000)
   FROM unnest(f.starts) AS st WHERE st > c.at - s.rate_per_ms * interval '1 millisecond')::float8 AS rate_free_in_ms,
  NOT ${notPaused(t, '$1')} AS paused,
  (SELECT count(*) FROM promoted) > 0
    OR EXISTS (SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL) AS keyed_work,
  EXISTS (SELECT 1 FROM ${jobs}
          WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now())
    OR EXISTS (SELECT 1 FROM ${jobs}
               WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now())
    OR EXISTS (SELECT 1 FROM ${groups} WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked
               AND head_ready_at <= now()) AS plain_work
FROM (SELECT clock_timestamp() AS at) AS c
LEFT JOIN ${settings} s ON s.queue = $1
LEFT JOIN ${flowState} f ON f.queue = $1 AND f.lane = ''`;
}

// One step of the walk over the queue's keys that have ready jobs, in key order: the next key
// after `after` (and at most `upTo`), one descent of jobs_key_ready_ix, however many jobs a key has.
function nextKey(jobs: string, after: string, upTo: string | null): string {
  return `(SELECT j.concurrency_key FROM ${jobs} j
   WHERE j.queue = $1 AND j.state = 'ready' AND j.concurrency_key IS NOT NULL
     AND j.concurrency_key > ${after}${upTo === null ? '' : ` AND j.concurrency_key <= ${upTo}`}
   ORDER BY j.concurrency_key LIMIT 1)`;
}

// $1 queue, $2 budget (jobs), $3 lease ms, $4 worker id, $5 flowBudget's time (kept for reference:
// the lease takes its own), $6 keys to look at,
// $7 concurrency per key (null: none), $8 key rate max, $9 key rate per ms (null: none),
// $10 jobs the ordinary claim just started in this claim, $11 queue rate per ms (null: no window
// kept).
//
// Keys in turn: the walk starts after the cursor (the last key served) and wraps around, so every
// key with ready jobs gets its turn however deep another key's backlog is. Each key found gets
// room = its free slots, its rate window's free starts, and an equal share of the budget; the
// keys' jobs are taken round by round (every key's first job, then every key's second...), in
// priority order within a key. The cursor moves to the last key served when the budget ran out,
// else past every key looked at (keys at their limit included, so a claim never stays on them).
export function flowLease(t: PgTables): string {
  const { jobs, flowState } = t;
  const at = '(SELECT at FROM stamp)';
  const window = (perMs: string) => `${at} - ${perMs}::float8 * interval '1 millisecond'`;
  return `WITH RECURSIVE stamp AS MATERIALIZED (
  -- The lease's time, taken in this statement: after its snapshot, so after every completion it
  -- counts as done (a job's claimed_at never precedes the end of the lease whose slot it took).
  SELECT clock_timestamp() AS at, $5::timestamptz AS budget_at
), cursor_row AS (
  SELECT COALESCE(cursor_key, '') AS cursor_key FROM ${flowState} WHERE queue = $1 AND lane = ''
), after_cursor (k, n) AS (
  SELECT ${nextKey(jobs, '(SELECT cursor_key FROM cursor_row)', null)}, 1
  UNION ALL
  SELECT ${nextKey(jobs, 'a.k', null)}, a.n + 1 FROM after_cursor a WHERE a.k IS NOT NULL AND a.n < $6
), before_cursor (k, n) AS (
  SELECT ${nextKey(jobs, "''", '(SELECT cursor_key FROM cursor_row)')}, 1
  WHERE (SELECT count(k) FROM after_cursor) < $6
  UNION ALL
  SELECT ${nextKey(jobs, 'b.k', '(SELECT cursor_key FROM cursor_row)')}, b.n + 1 FROM before_cursor b
  WHERE b.k IS NOT NULL AND b.n + (SELECT count(k) FROM after_cursor) < $6
), walked AS MATERIALIZED (
  SELECT k, n AS ord FROM after_cursor WHERE k IS NOT NULL
  UNION ALL
  SELECT k, $6 + n FROM before_cursor WHERE k IS NOT NULL
), rooms AS MATERIALIZED (
  SELECT w.k, w.ord,
    LEAST(
      CASE WHEN $7::int IS NULL THEN $2::int
           ELSE $7::int - (SELECT count(*) FROM ${jobs} l
                           WHERE l.queue = $1 AND l.state = 'leased' AND l.concurrency_key = w.k)::int END,
      CASE WHEN $8::int IS NULL THEN $2::int
           ELSE $8::int - (SELECT count(*) FROM unnest(f.starts) AS st WHERE st > ${window('$9')})::int END,
      $2::int) AS room
  FROM walked w
  LEFT JOIN ${flowState} f ON f.queue = $1 AND f.lane = w.k
  WHERE f.blocked_until IS NULL OR f.blocked_until <= (SELECT at FROM stamp)
), share AS (
  SELECT GREATEST(1, ceil($2::numeric / NULLIF(count(*), 0)))::int AS per FROM rooms WHERE room > 0
), chosen AS MATERIALIZED (
  SELECT p.id FROM rooms r CROSS JOIN share
  CROSS JOIN LATERAL (
    SELECT j.id, row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.id) AS rn
    FROM (SELECT id, priority, run_at FROM ${jobs}
          WHERE queue = $1 AND state = 'ready' AND concurrency_key = r.k AND run_at <= (SELECT at FROM stamp)
          ORDER BY priority DESC, run_at, id
          LIMIT LEAST(r.room, share.per)) AS j
  ) AS p
  WHERE r.room > 0 AND ${notPaused(t, '$1')}
  ORDER BY p.rn, r.ord
  LIMIT $2
), updated AS (
  UPDATE ${jobs} AS j
  SET state = 'leased', claim_token = gen_random_uuid(), attempts = j.attempts + 1,
      lease_until = (SELECT at FROM stamp) + $3::float8 * interval '1 millisecond', claimed_at = (SELECT at FROM stamp), worker_id = $4
  FROM chosen c
  WHERE j.id = c.id AND j.state = 'ready'
  RETURNING j.id, j.payload, j.priority, j.group_key, j.idempotency_key, j.concurrency_key, j.attempts, j.max_attempts,
            j.claim_token, j.created_at, j.claimed_at, j.lease_until, j.trace_context
), served AS (
  SELECT max(w.ord) AS last_ord FROM walked w WHERE w.k IN (SELECT concurrency_key FROM updated)
), moved AS (
  UPDATE ${flowState} AS f
  SET cursor_key = COALESCE(
        (SELECT w.k FROM walked w
         WHERE w.ord = CASE WHEN (SELECT count(*) FROM updated) >= $2 THEN (SELECT last_ord FROM served)
                            ELSE (SELECT max(ord) FROM walked) END),
        f.cursor_key),
      starts = CASE WHEN $11::float8 IS NULL THEN '{}'::timestamptz[]
                    ELSE ARRAY(SELECT st FROM unnest(f.starts) AS st WHERE st > ${window('$11')})
                         || array_fill((SELECT at FROM stamp), ARRAY[$10::int + (SELECT count(*) FROM updated)::int]) END,
      updated_at = (SELECT at FROM stamp)
  WHERE f.queue = $1 AND f.lane = ''
), key_starts AS (
  INSERT INTO ${flowState} AS f (queue, lane, starts, updated_at)
  SELECT $1, u.concurrency_key, array_fill((SELECT at FROM stamp), ARRAY[count(*)::int]), (SELECT at FROM stamp)
  FROM updated u WHERE $8::int IS NOT NULL
  GROUP BY u.concurrency_key ORDER BY u.concurrency_key
  ON CONFLICT (queue, lane) DO UPDATE
  SET starts = ARRAY(SELECT st FROM unnest(f.starts) AS st WHERE st > ${window('$9')}) || EXCLUDED.starts,
      updated_at = EXCLUDED.updated_at
)
SELECT id::text AS id, payload, priority, group_key, idempotency_key, concurrency_key, attempts, max_attempts,
       claim_token::text AS claim_token,
       (extract(epoch FROM created_at) * 1000)::float8 AS created_ms,
       (extract(epoch FROM claimed_at) * 1000)::float8 AS claimed_ms,
       (extract(epoch FROM lease_until) * 1000)::float8 AS lease_until_ms, trace_context
FROM updated`;
}

// $1 queue, $2 flowBudget's time (kept for reference), $3 jobs the ordinary claim started, $4 queue rate per ms: the starts of
// a claim that leased no keyed job (flowLease did not run), in the queue's window, at this
// statement's time: no earlier than their claimed_at, so a start leaves the window no sooner than
// it should.
export function flowRecordStarts(t: PgTables): string {
  const { flowState } = t;
  return `WITH stamp AS MATERIALIZED (SELECT clock_timestamp() AS at, $2::timestamptz AS budget_at)
UPDATE ${flowState} AS f
SET starts = ARRAY(SELECT st FROM unnest(f.starts) AS st
                   WHERE st > (SELECT at FROM stamp) - $4::float8 * interval '1 millisecond')
             || array_fill((SELECT at FROM stamp), ARRAY[$3::int]),
    updated_at = (SELECT at FROM stamp)
WHERE f.queue = $1 AND f.lane = ''`;
}

// $1 queue, $2 keys to list. A monitoring read: the queue's recorded limits, its leased jobs, the
// starts in its window, and per key its leased (jobs_key_leased_ix) and waiting
// (jobs_key_ready_ix, read in key order) jobs, the busiest $2 listed.
export function flowUsage(t: PgTables): string {
  const { jobs, settings, flowState } = t;
  return `WITH running AS (
  SELECT concurrency_key AS key, count(*)::int AS running FROM ${jobs}
  WHERE queue = $1 AND state = 'leased' AND concurrency_key IS NOT NULL GROUP BY concurrency_key
), waiting AS (
  SELECT concurrency_key AS key, count(*)::int AS waiting FROM ${jobs}
  WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL GROUP BY concurrency_key
), per_key AS (
  SELECT COALESCE(r.key, w.key) AS key, COALESCE(r.running, 0) AS running, COALESCE(w.waiting, 0) AS waiting
  FROM running r FULL JOIN waiting w ON w.key = r.key
)
SELECT s.global_concurrency, s.concurrency_per_key, s.rate_max, s.rate_per_ms, s.key_rate_max, s.key_rate_per_ms,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'leased') AS running,
  CASE WHEN s.rate_max IS NOT NULL THEN
    (SELECT count(*)::int FROM unnest(f.starts) AS st WHERE st > now() - s.rate_per_ms * interval '1 millisecond') END
    AS window_starts,
  CASE WHEN s.concurrency_per_key IS NOT NULL THEN
    (SELECT count(*)::int FROM per_key WHERE waiting > 0 AND running >= s.concurrency_per_key) END AS keys_at_limit,
  (SELECT COALESCE(json_agg(json_build_object('key', key, 'running', running, 'waiting', waiting)
                            ORDER BY running DESC, waiting DESC, key), '[]')
   FROM (SELECT * FROM per_key ORDER BY running DESC, waiting DESC, key LIMIT $2) AS top) AS keys
FROM (VALUES (1)) AS one (x)
LEFT JOIN ${settings} s ON s.queue = $1
LEFT JOIN ${flowState} f ON f.queue = $1 AND f.lane = ''`;
}

// $1 batch size. Retention of the per-key rows (rateLimitPerKey windows and postponed keys): a
// row whose key has neither a start in its window nor a wait ahead is deleted; the next start
// of the key writes a new one. A flow claim that holds a row is skipped, not waited for.
export function cleanupFlowState(t: PgTables): string {
  const { settings, flowState } = t;
  return `DELETE FROM ${flowState} WHERE (queue, lane) IN (
  SELECT f.queue, f.lane FROM ${flowState} f
  LEFT JOIN ${settings} s ON s.queue = f.queue
  WHERE f.lane <> '' AND (f.blocked_until IS NULL OR f.blocked_until < now())
    AND f.updated_at < now() - COALESCE(s.key_rate_per_ms, 0) * interval '1 millisecond' - interval '1 minute'
  LIMIT $1
  FOR UPDATE OF f SKIP LOCKED
)`;
}
