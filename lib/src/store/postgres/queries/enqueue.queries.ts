// Enqueue: single, bulk and uniform bulk inserts with their idempotency keys and groups, the key
// look-up, recorded queue settings, and the NOTIFY that wakes other processes.
import type { PgTables } from './tables.js';

// A job's attempts: its own, else what the queue's consumers recorded, else the producer's
// default. The subquery names no input column, so it runs once per statement (an InitPlan).
// $1 is cast as the column it is inserted into, or its type is deduced twice, differently.
function maxAttempts(t: PgTables, own: string, fallback: string): string {
  const { settings } = t;
  return `COALESCE(${own}, (SELECT s.max_attempts FROM ${settings} s WHERE s.queue = $1::varchar), ${fallback})`;
}

// A job whose run_at is later than the statement's time waits as 'delayed', outside the ready
// index the claim reads; the claim promotes it once due (see claim).
function oneRunAt(_t: PgTables): string {
  return `COALESCE($4::timestamptz, statement_timestamp() + $5::float8 * interval '1 millisecond')`;
}

function manyRunAt(_t: PgTables): string {
  return `COALESCE(run_at, statement_timestamp() + delay_ms * interval '1 millisecond')`;
}

function stateFor(_t: PgTables, runAt: string): string {
  return `CASE WHEN ${runAt} > statement_timestamp() THEN 'delayed' ELSE 'ready' END`;
}

// $1 queue, $2 payload, $3 priority, $4 run_at, $5 delay_ms, $6 group_key, $7 idempotency_key,
// $8 max_attempts (null: the queue's setting), $9 default max_attempts, $10 trace_context,
// $11 concurrency_key
export function enqueueOne(t: PgTables): string {
  const { jobs } = t;
  return `INSERT INTO ${jobs} (queue, state, payload, priority, run_at, group_key, idempotency_key, max_attempts,
                     trace_context, concurrency_key, created_at)
VALUES ($1, ${stateFor(t, oneRunAt(t))}, $2::jsonb, $3, ${oneRunAt(t)}, $6, $7,
        ${maxAttempts(t, '$8::int', '$9::int')}, $10, $11, statement_timestamp())
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id::text AS id`;
}

// $1 queue, then one array per column ($2 payload jsonb[], $3 priority, $4 run_at, $5 delay_ms,
// $6 group_key, $7 idempotency_key, $8 max_attempts (null elements: the queue's setting),
// $9 default max_attempts, $10 trace_context, $11 concurrency_key). Typed arrays parse faster than one
// JSON document. Ids are drawn before the insert so each input row keeps its id whether or
// not it was inserted: results come back in input order without trusting RETURNING's order.
export function enqueueMany(t: PgTables): string {
  const { jobs, jobIdSeq } = t;
  return `WITH input AS MATERIALIZED (
  SELECT i.*, nextval('${jobIdSeq}') AS id
  FROM unnest($2::jsonb[], $3::int[], $4::timestamptz[], $5::float8[], $6::text[], $7::text[], $8::int[], $9::int[],
              $10::text[], $11::text[])
       WITH ORDINALITY AS i(payload, priority, run_at, delay_ms, group_key, idempotency_key, max_attempts, default_max_attempts,
                            trace_context, concurrency_key, ord)
), inserted AS (
  INSERT INTO ${jobs} (id, queue, state, payload, priority, run_at, group_key, idempotency_key, max_attempts, trace_context,
                       concurrency_key, created_at)
  SELECT id, $1, ${stateFor(t, manyRunAt(t))}, payload, priority, ${manyRunAt(t)},
         group_key, idempotency_key, ${maxAttempts(t, 'max_attempts', 'default_max_attempts')}, trace_context,
         concurrency_key, statement_timestamp()
  FROM input ORDER BY idempotency_key, ord
  ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
  RETURNING id
)
SELECT (input.ord - 1)::int AS ord, input.id::text AS id, (inserted.id IS NOT NULL) AS created
FROM input LEFT JOIN inserted ON inserted.id = input.id
ORDER BY input.ord`;
}

// The common bulk case: no idempotency keys and the same options for every job, so only
// the payloads travel, as one JSON array ($2: json, split before each payload becomes jsonb,
// so the batch is not bound by jsonb's 256 MB per value); the rest are scalars ($3 priority, $4 run_at,
// $5 delay_ms, $6 group_key, $7 max_attempts or null, $8 default max_attempts, $9 trace_context: an
// enqueueMany's jobs share its span's; $10 concurrency_key). Every row is inserted (no conflict target), so the ids
// drawn in input order are the answer.
export function enqueueManyUniform(t: PgTables): string {
  const { jobs, jobIdSeq } = t;
  return `WITH input AS MATERIALIZED (
  SELECT p::jsonb AS payload, ord, nextval('${jobIdSeq}') AS id
  FROM json_array_elements($2::json) WITH ORDINALITY AS t(p, ord)
), inserted AS (
  INSERT INTO ${jobs} (id, queue, state, payload, priority, run_at, group_key, max_attempts, trace_context,
                       concurrency_key, created_at)
  SELECT id, $1, ${stateFor(t, oneRunAt(t))}, payload, $3, ${oneRunAt(t)},
         $6, ${maxAttempts(t, '$7::int', '$8::int')}, $9::varchar, $10::varchar, statement_timestamp()
  FROM input
)
SELECT id::text AS id FROM input ORDER BY ord`;
}

// $1 jsonb [{queue, max_attempts, group_on_dead, global_concurrency, concurrency_per_key, rate_max,
// rate_per_ms, key_rate_max, key_rate_per_ms}], one entry per queue, in queue order (concurrent
// boots lock the same rows in the same order). Insert, or update what an earlier boot recorded:
// the last consumer to boot sets the queue's limits for every instance's flow claims.
export function recordQueueSettings(t: PgTables): string {
  const { settings } = t;
  return `INSERT INTO ${settings} AS s (queue, max_attempts, group_on_dead, global_concurrency, concurrency_per_key,
                         rate_max, rate_per_ms, key_rate_max, key_rate_per_ms, updated_at)
SELECT i.queue, i.max_attempts, i.group_on_dead, i.global_concurrency, i.concurrency_per_key,
       i.rate_max, i.rate_per_ms, i.key_rate_max, i.key_rate_per_ms, now()
FROM jsonb_to_recordset($1::jsonb) AS i(queue text, max_attempts int, group_on_dead text, global_concurrency int,
                                        concurrency_per_key int, rate_max int, rate_per_ms int, key_rate_max int,
                                        key_rate_per_ms int)
ORDER BY i.queue
ON CONFLICT (queue) DO UPDATE
SET max_attempts = EXCLUDED.max_attempts, group_on_dead = EXCLUDED.group_on_dead,
    global_concurrency = EXCLUDED.global_concurrency, concurrency_per_key = EXCLUDED.concurrency_per_key,
    rate_max = EXCLUDED.rate_max, rate_per_ms = EXCLUDED.rate_per_ms,
    key_rate_max = EXCLUDED.key_rate_max, key_rate_per_ms = EXCLUDED.key_rate_per_ms, updated_at = EXCLUDED.updated_at`;
}

// $1 jsonb [{queue, key}]
export function findByIdempotencyKeys(t: PgTables): string {
  const { jobs } = t;
  return `SELECT j.queue, j.idempotency_key, j.id::text AS id
FROM jsonb_to_recordset($1::jsonb) AS k(queue text, key text)
JOIN ${jobs} j ON j.queue = k.queue AND j.idempotency_key = k.key`;
}

// A wake-up is only a hint: its transaction need not wait for a WAL flush (is_local: this
// statement's own transaction only).
export function notify(_t: PgTables): string {
  return `SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)`;
}
