// Measurements: per-queue stats, monitoring settings, the bounded health reading, throughput buckets.
import type { PgTables } from './tables.js';

// Each figure reads one partial index, so the cost follows live rows, not history. A delayed
// job that is due but not promoted yet (no claim since) counts as ready: it is waiting. Ready
// rows not due yet only exist if written by a version before 3 (the migration moved them).
// Grouped jobs waiting behind their group's head count as ready or delayed by their run time,
// as the ones a claim can take do; so do keyed jobs waiting for a slot (jobs_key_ready_ix).
export function stats(t: PgTables): string {
  const { jobs, groups, pauses } = t;
  return `WITH grouped AS (
  SELECT count(*) FILTER (WHERE state IN ('ready', 'delayed') AND run_at <= now())::int AS ready,
         count(*) FILTER (WHERE state IN ('ready', 'delayed') AND run_at > now())::int AS delayed,
         count(*) FILTER (WHERE state IN ('ready', 'delayed') AND attempts > 0)::int AS retrying,
         min(run_at) FILTER (WHERE state IN ('ready', 'delayed') AND run_at <= now()) AS oldest_due
  FROM ${jobs} WHERE queue = $1 AND group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased')
)
SELECT
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL AND run_at <= now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now())
  + (SELECT ready FROM grouped) AS ready,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at > now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND run_at > now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL AND run_at > now())
  + (SELECT delayed FROM grouped) AS delayed,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'leased') AS leased,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'leased' AND lease_until < now()) AS expired_leases,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'dead') AS dead,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND attempts > 0)
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL AND attempts > 0)
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND attempts > 0)
  + (SELECT retrying FROM grouped) AS retrying,
  (SELECT count(*)::int FROM ${groups} WHERE queue = $1 AND blocked) AS blocked_groups,
  EXISTS (SELECT 1 FROM ${pauses} WHERE queue = $1) AS paused,
  (SELECT floor(extract(epoch FROM now() - min(run_at)) * 1000)::float8 FROM (
     (SELECT run_at FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now() ORDER BY run_at LIMIT 1)
     UNION ALL
     (SELECT run_at FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL AND run_at <= now() ORDER BY run_at LIMIT 1)
     UNION ALL
     (SELECT run_at FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND run_at <= now() ORDER BY run_at LIMIT 1)
     UNION ALL
     (SELECT oldest_due FROM grouped)
   ) AS oldest) AS oldest_ready_age_ms`;
}

// $1 queues (one entry each, in any order), $2 completed, $3 failed, $4 dead. Upsert-adds into
// each queue's bucket of the current minute (the database clock; now() is the statement's
// time in autocommit). A concurrent first insert of the same bucket makes this one wait and
// add instead; rows go in queue order, so two flushes lock their buckets in one order and
// never deadlock.
export function recordThroughput(t: PgTables): string {
  const { throughput } = t;
  return `INSERT INTO ${throughput} AS t (minute, queue, completed, failed, dead, busy_ms)
SELECT date_trunc('minute', now(), 'UTC'), c.queue, c.completed, c.failed, c.dead, c.busy_ms
FROM unnest($1::varchar[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) AS c(queue, completed, failed, dead, busy_ms)
ORDER BY c.queue
ON CONFLICT (minute, queue) DO UPDATE
SET completed = t.completed + EXCLUDED.completed, failed = t.failed + EXCLUDED.failed, dead = t.dead + EXCLUDED.dead,
    busy_ms = t.busy_ms + EXCLUDED.busy_ms`;
}

// $1 minutes: the buckets of the last $1 minutes, the current one included, oldest first, as
// one range of throughput_pk; one row with no bucket when there are none, for the clock.
export function readThroughput(t: PgTables): string {
  const { throughput } = t;
  return `SELECT now() AS now, b.minute, b.queue, b.completed, b.failed, b.dead
FROM (VALUES (1)) AS one (x)
LEFT JOIN (
  SELECT minute, queue, completed::float8 AS completed, failed::float8 AS failed, dead::float8 AS dead
  FROM ${throughput}
  WHERE minute >= date_trunc('minute', now(), 'UTC') - ($1::int - 1) * interval '1 minute'
) AS b ON true
ORDER BY b.minute, b.queue`;
}

// For the rest of the transaction (is_local): a monitoring read runs serially and without
// JIT. With a large backlog its estimated cost crosses jit_above_cost and the parallel
// thresholds, and on 100k ready jobs JIT compilation plus parallel workers made it 7×
// slower (190 ms instead of 27 ms) while taking CPU from the database mid-incident.
export function monitoringSettings(_t: PgTables): string {
  return `SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)`;
}

// $1 failure window ms, $2 repeated-failure threshold. Every queue in one statement, for
// scrapes: each live figure reads one partial index (ready, leased, dead), so done rows are
// never touched. The attempts table has no index on finished_at alone, so its queues are
// walked on (queue, finished_at) with a recursive "loose index scan" (one seek per queue),
// and each queue's recent attempts are one range seek on the same index.
// Waiting jobs (ready and delayed) count as ready when due, delayed when not, as in stats.
// Failures: a waiting job has failed `attempts` times; a leased one `attempts - 1` times.
export function queueHealth(t: PgTables): string {
  const { jobs, attempts, groups, pauses } = t;
  return `WITH ready AS (
  SELECT queue,
         count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS delayed,
         count(*) FILTER (WHERE attempts > 0) AS retrying,
         count(*) FILTER (WHERE attempts >= $2::int) AS repeated,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due
  FROM (SELECT queue, run_at, attempts FROM ${jobs} WHERE state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL
        UNION ALL
        SELECT queue, run_at, attempts FROM ${jobs} WHERE state = 'ready' AND concurrency_key IS NOT NULL
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
  UNION SELECT queue FROM blocked UNION SELECT queue FROM ${pauses}
)
SELECT q.queue,
       COALESCE(r.ready, 0)::float8 AS ready, COALESCE(r.delayed, 0)::float8 AS delayed,
       COALESCE(l.leased, 0)::float8 AS leased, COALESCE(l.expired_leases, 0)::float8 AS expired_leases,
       COALESCE(d.dead, 0)::float8 AS dead, COALESCE(r.retrying, 0)::float8 AS retrying,
       COALESCE(b.blocked_groups, 0)::float8 AS blocked_groups,
       (COALESCE(r.repeated, 0) + COALESCE(l.repeated, 0))::float8 AS repeatedly_failing,
       COALESCE(f.failed, 0)::float8 AS recent_failures, COALESCE(f.lease_expired, 0)::float8 AS recent_lease_expiries,
       COALESCE(floor(extract(epoch FROM now() - r.oldest_due) * 1000), 0)::float8 AS oldest_ready_age_ms,
       EXISTS (SELECT 1 FROM ${pauses} p WHERE p.queue = q.queue) AS paused
FROM queues q
LEFT JOIN ready r ON r.queue = q.queue
LEFT JOIN leased l ON l.queue = q.queue
LEFT JOIN dead d ON d.queue = q.queue
LEFT JOIN blocked b ON b.queue = q.queue
LEFT JOIN failures f ON f.queue = q.queue
ORDER BY q.queue`;
}
