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

  // ---- health and measurements ----
  monitoringSettings: string;
  queueHealth: string;
}

const JOB_COLUMNS = `id::text AS id, queue, state, payload, priority, run_at, group_key, idempotency_key,
  attempts, max_attempts, claim_token::text AS claim_token, lease_until, worker_id, created_at,
  claimed_at, finished_at, last_error`;

export function pgQueries(schema: string): PgQueries {
  const jobs = `${quotePgIdentifier(schema)}.jobs`;
  const attempts = `${quotePgIdentifier(schema)}.attempts`;
  const jobIdSeq = `${quotePgIdentifier(schema)}.jobs_id_seq`;
  const settings = `${quotePgIdentifier(schema)}.queue_settings`;
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
    // $8 max_attempts (null: the queue's setting), $9 default max_attempts
    enqueueOne: `INSERT INTO ${jobs} (queue, state, payload, priority, run_at, group_key, idempotency_key, max_attempts, created_at)
VALUES ($1, ${stateFor(oneRunAt)}, $2::jsonb, $3, ${oneRunAt}, $6, $7,
        ${maxAttempts('$8::int', '$9::int')}, statement_timestamp())
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id::text AS id`,

    // $1 queue, then one array per column ($2 payload jsonb[], $3 priority, $4 run_at, $5 delay_ms,
    // $6 group_key, $7 idempotency_key, $8 max_attempts (null elements: the queue's setting),
    // $9 default max_attempts). Typed arrays parse faster than one
    // JSON document. Ids are drawn before the insert so each input row keeps its id whether or
    // not it was inserted: results come back in input order without trusting RETURNING's order.
    enqueueMany: `WITH input AS MATERIALIZED (
  SELECT i.*, nextval('${jobIdSeq}') AS id
  FROM unnest($2::jsonb[], $3::int[], $4::timestamptz[], $5::float8[], $6::text[], $7::text[], $8::int[], $9::int[])
       WITH ORDINALITY AS i(payload, priority, run_at, delay_ms, group_key, idempotency_key, max_attempts, default_max_attempts, ord)
), inserted AS (
  INSERT INTO ${jobs} (id, queue, state, payload, priority, run_at, group_key, idempotency_key, max_attempts, created_at)
  SELECT id, $1, ${stateFor(manyRunAt)}, payload, priority, ${manyRunAt},
         group_key, idempotency_key, ${maxAttempts('max_attempts', 'default_max_attempts')}, statement_timestamp()
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
    // $5 delay_ms, $6 group_key, $7 max_attempts or null, $8 default max_attempts). Every row is
    // inserted (no conflict target), so the ids drawn in input order are the answer.
    enqueueManyUniform: `WITH input AS MATERIALIZED (
  SELECT p::jsonb AS payload, ord, nextval('${jobIdSeq}') AS id
  FROM json_array_elements($2::json) WITH ORDINALITY AS t(p, ord)
), inserted AS (
  INSERT INTO ${jobs} (id, queue, state, payload, priority, run_at, group_key, max_attempts, created_at)
  SELECT id, $1, ${stateFor(oneRunAt)}, payload, $3, ${oneRunAt},
         $6, ${maxAttempts('$7::int', '$8::int')}, statement_timestamp()
  FROM input
)
SELECT id::text AS id FROM input ORDER BY ord`,

    // $1 jsonb [{queue, max_attempts}], one entry per queue, in queue order (concurrent boots
    // lock the same rows in the same order). Insert, or update what an earlier boot recorded.
    recordQueueSettings: `INSERT INTO ${settings} AS s (queue, max_attempts, updated_at)
SELECT i.queue, i.max_attempts, now()
FROM jsonb_to_recordset($1::jsonb) AS i(queue text, max_attempts int)
ORDER BY i.queue
ON CONFLICT (queue) DO UPDATE SET max_attempts = EXCLUDED.max_attempts, updated_at = EXCLUDED.updated_at`,

    // $1 jsonb [{queue, key}]
    findByIdempotencyKeys: `SELECT j.queue, j.idempotency_key, j.id::text AS id
FROM jsonb_to_recordset($1::jsonb) AS k(queue text, key text)
JOIN ${jobs} j ON j.queue = k.queue AND j.idempotency_key = k.key`,

    // $1 queue, $2 limit, $3 lease ms, $4 worker id.
    // Two ordered range reads, each stopping after $2 rows: the queue's due ready rows in claim
    // order (jobs_claim_ix, which holds no delayed rows), and its due delayed rows, oldest first
    // (jobs_delayed_ix). The best $2 of both, in claim order, are leased; the other due delayed
    // rows read are promoted to ready in the same UPDATE. One statement, because a data-modifying
    // CTE's changes are invisible to the rest of its statement: a promotion CTE followed by a
    // select of ready rows would not see the promoted ones. So a delayed job is claimable at the
    // first claim after it is due, and the claim's cost follows due work, never the delayed backlog.
    // MATERIALIZED keeps the planner from merging the candidate scans into the UPDATE, which
    // could lock and update more rows than LIMIT allows. SKIP LOCKED lets concurrent claimers
    // pass each other instead of queueing on the same rows.
    claim: `WITH due_ready AS MATERIALIZED (
  SELECT id, priority, run_at FROM ${jobs}
  WHERE queue = $1 AND state = 'ready' AND run_at <= now()
  ORDER BY priority DESC, run_at, id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), due_delayed AS MATERIALIZED (
  SELECT id, priority, run_at FROM ${jobs}
  WHERE queue = $1 AND state = 'delayed' AND run_at <= now()
  ORDER BY run_at, id
  LIMIT $2
  FOR UPDATE SKIP LOCKED
), candidates AS MATERIALIZED (
  -- Ready rows that lose their place to promoted ones are left as they are (no new row version).
  SELECT id, lease FROM (
    SELECT id, delayed, row_number() OVER (ORDER BY priority DESC, run_at, id) <= $2 AS lease
    FROM (SELECT *, false AS delayed FROM due_ready UNION ALL SELECT *, true FROM due_delayed) AS due
  ) AS ranked
  WHERE lease OR delayed
), updated AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN c.lease THEN 'leased' ELSE 'ready' END,
      claim_token = CASE WHEN c.lease THEN gen_random_uuid() ELSE j.claim_token END,
      attempts = CASE WHEN c.lease THEN j.attempts + 1 ELSE j.attempts END,
      lease_until = CASE WHEN c.lease THEN now() + $3::float8 * interval '1 millisecond' ELSE j.lease_until END,
      claimed_at = CASE WHEN c.lease THEN now() ELSE j.claimed_at END,
      worker_id = CASE WHEN c.lease THEN $4 ELSE j.worker_id END
  FROM candidates c
  WHERE j.id = c.id
  RETURNING c.lease, j.id, j.payload, j.priority, j.group_key, j.idempotency_key, j.attempts, j.max_attempts,
            j.claim_token, j.created_at, j.claimed_at, j.lease_until
)
SELECT id::text AS id, payload, priority, group_key, idempotency_key, attempts, max_attempts,
       claim_token::text AS claim_token,
       -- epoch milliseconds: far cheaper for the client to turn into Dates than timestamp text
       (extract(epoch FROM created_at) * 1000)::float8 AS created_ms,
       (extract(epoch FROM claimed_at) * 1000)::float8 AS claimed_ms,
       (extract(epoch FROM lease_until) * 1000)::float8 AS lease_until_ms
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
  RETURNING j.id
)
SELECT input.id::text AS id,
  CASE WHEN completed.id IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${jobs} d WHERE d.id = input.id AND d.claim_token = input.token AND d.state = 'done') THEN 'already'
       ELSE 'lost' END AS outcome
FROM input LEFT JOIN completed ON completed.id = input.id`,

    // $1 jsonb [{id, token, error, stack, delay_ms, dead, worker}]. A retry that is not due yet
    // waits as 'delayed' (out of the claim's ready index); the claim promotes it once due.
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
  RETURNING j.id, j.queue, j.state, j.attempts, j.claimed_at, i.token, i.error, i.stack, i.worker
), history AS (
  INSERT INTO ${attempts} (job_id, queue, attempt, outcome, error, stack, worker_id, claim_token, started_at, finished_at)
  SELECT id, queue, attempts, 'failed', error, stack, worker, token, claimed_at, now() FROM failed
)
SELECT input.id::text AS id, failed.state,
  CASE WHEN failed.id IS NOT NULL THEN 'ok'
       WHEN EXISTS (SELECT 1 FROM ${attempts} a WHERE a.job_id = input.id AND a.claim_token = input.token AND a.outcome = 'failed') THEN 'already'
       ELSE 'lost' END AS outcome
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
  RETURNING j.id
)
SELECT input.id::text AS id, CASE WHEN released.id IS NOT NULL THEN 'ok' ELSE 'lost' END AS outcome
FROM input LEFT JOIN released ON released.id = input.id`,

    // $1 batch size. One conditional statement: lock expired leases (skipping rows another
    // reaper holds), re-check under the lock, void the token, record the lost attempt.
    // run_at stays as it was: the job keeps its place, and its waiting age keeps counting.
    reap: `WITH expired AS MATERIALIZED (
  SELECT id, claim_token, worker_id, claimed_at, lease_until FROM ${jobs}
  WHERE state = 'leased' AND lease_until < now()
  ORDER BY lease_until
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), reaped AS (
  UPDATE ${jobs} AS j
  SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
      finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
      claim_token = NULL, lease_until = NULL,
      last_error = 'lease expired at ' || to_char(e.lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                   || ' (worker ' || COALESCE(e.worker_id, 'unknown') || ')'
  FROM expired e
  WHERE j.id = e.id AND j.state = 'leased' AND j.claim_token = e.claim_token AND j.lease_until < now()
  RETURNING j.id, j.queue, j.state, j.attempts, j.last_error, e.claim_token, e.worker_id, e.claimed_at
), history AS (
  INSERT INTO ${attempts} (job_id, queue, attempt, outcome, error, stack, worker_id, claim_token, started_at, finished_at)
  SELECT id, queue, attempts, 'lease-expired', last_error, NULL, worker_id, claim_token, claimed_at, now() FROM reaped
)
SELECT id::text AS id, queue, state, attempts FROM reaped`,

    // A due delayed job counts: the next claim promotes and takes it.
    hasClaimableWork: `SELECT EXISTS (
  SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND run_at <= now()
) OR EXISTS (
  SELECT 1 FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND run_at <= now()
) AS has_work`,

    // Each figure reads one partial index, so the cost follows live rows, not history. A delayed
    // job that is due but not promoted yet (no claim since) counts as ready: it is waiting. Ready
    // rows not due yet only exist if written by a version before 3 (the migration moved them).
    stats: `SELECT
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND run_at <= now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND run_at <= now()) AS ready,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND run_at > now())
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND run_at > now()) AS delayed,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'leased') AS leased,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'leased' AND lease_until < now()) AS expired_leases,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'dead') AS dead,
  (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND attempts > 0)
  + (SELECT count(*)::int FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND attempts > 0) AS retrying,
  (SELECT floor(extract(epoch FROM now() - min(run_at)) * 1000)::float8 FROM (
     (SELECT run_at FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND run_at <= now() ORDER BY run_at LIMIT 1)
     UNION ALL
     (SELECT run_at FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND run_at <= now() ORDER BY run_at LIMIT 1)
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

    // $1 queue, $2 jsonb array of ids
    retryDead: `UPDATE ${jobs}
SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL
WHERE queue = $1 AND state = 'dead' AND id IN (SELECT value::bigint FROM jsonb_array_elements_text($2::jsonb))
RETURNING id::text AS id`,

    retryAllDead: `UPDATE ${jobs}
SET state = 'ready', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL
WHERE queue = $1 AND state = 'dead'
RETURNING id::text AS id`,

    // $1 queue, $2 older-than ms (0 for all), $3 batch size. The rows are locked where they are
    // chosen: FOR UPDATE re-checks the conditions on a row another statement changed (a dead job
    // retryDead moved back to ready is no longer chosen), and SKIP LOCKED never waits on one.
    purgeDead: `DELETE FROM ${jobs} WHERE id IN (
  SELECT id FROM ${jobs}
  WHERE queue = $1 AND state = 'dead' AND finished_at <= now() - $2::float8 * interval '1 millisecond'
  ORDER BY id LIMIT $3
  FOR UPDATE SKIP LOCKED
)`,

    // $1 done retention ms, $2 idempotency retention ms, $3 dead retention ms (null: keep), $4 batch.
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
  (SELECT id FROM ${jobs}
   WHERE $3::float8 IS NOT NULL AND state = 'dead'
     AND finished_at < now() - $3::float8 * interval '1 millisecond'
     AND (idempotency_key IS NULL
          OR finished_at < now() - GREATEST($3::float8, $2::float8) * interval '1 millisecond')
   ORDER BY finished_at LIMIT $4)
) AND (state = 'done' OR (state = 'dead' AND $3::float8 IS NOT NULL))
  AND finished_at < now() - LEAST($1::float8, COALESCE($3::float8, $1::float8)) * interval '1 millisecond'`,

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
  FROM (SELECT queue, run_at, attempts FROM ${jobs} WHERE state = 'ready'
        UNION ALL
        SELECT queue, run_at, attempts FROM ${jobs} WHERE state = 'delayed') AS waiting
  GROUP BY queue
), leased AS (
  SELECT queue, count(*) AS leased, count(*) FILTER (WHERE lease_until < now()) AS expired_leases,
         count(*) FILTER (WHERE attempts > $2::int) AS repeated
  FROM ${jobs} WHERE state = 'leased' GROUP BY queue
), dead AS (
  SELECT queue, count(*) AS dead FROM ${jobs} WHERE state = 'dead' GROUP BY queue
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
)
SELECT q.queue,
       COALESCE(r.ready, 0)::float8 AS ready, COALESCE(r.delayed, 0)::float8 AS delayed,
       COALESCE(l.leased, 0)::float8 AS leased, COALESCE(l.expired_leases, 0)::float8 AS expired_leases,
       COALESCE(d.dead, 0)::float8 AS dead, COALESCE(r.retrying, 0)::float8 AS retrying,
       (COALESCE(r.repeated, 0) + COALESCE(l.repeated, 0))::float8 AS repeatedly_failing,
       COALESCE(f.failed, 0)::float8 AS recent_failures, COALESCE(f.lease_expired, 0)::float8 AS recent_lease_expiries,
       COALESCE(floor(extract(epoch FROM now() - r.oldest_due) * 1000), 0)::float8 AS oldest_ready_age_ms
FROM queues q
LEFT JOIN ready r ON r.queue = q.queue
LEFT JOIN leased l ON l.queue = q.queue
LEFT JOIN dead d ON d.queue = q.queue
LEFT JOIN failures f ON f.queue = q.queue
ORDER BY q.queue`,
  };
}
