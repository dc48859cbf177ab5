// The scale recommendation's inputs (core/scaling), and the SQL function that applies its rule in
// the database for KEDA's postgresql scaler.
import { MAX_MEASURED_RUN_MS, SCALE_WINDOW_MINUTES } from '../../../core/scaling/index.js';

/** The most readers the rule gives (core/scaling's bound). */
const MAX_READERS = 2_147_483_647;
import { quotePgIdentifier } from '../postgres.identifiers.js';
import type { PgTables } from './tables.js';

// $1 queue. What a claim could take now, what runs, and the completions of the last five whole
// minutes (ScaleInputs): one statement, each count through the partial index its claim reads
// (ungrouped and keyed ready jobs, due delayed ones, claimable and due waiting group heads), so its
// cost follows the live backlog. A keyed job counts while its key is under concurrencyPerKey; a
// group counts once, by its head, and not while blocked or held. Plain reads: a row a claimer has
// locked is counted as it was.
export function scaleInputs(t: PgTables): string {
  const { jobs, groups, settings, throughput, pauses, flowState } = t;
  return `WITH s AS (
  SELECT global_concurrency, concurrency_per_key, rate_max, rate_per_ms FROM ${settings} WHERE queue = $1
), keyed AS (
  SELECT k.n, COALESCE(l.n, 0) AS leased
  FROM (SELECT concurrency_key, count(*) AS n FROM (
          SELECT concurrency_key FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND concurrency_key IS NOT NULL AND run_at <= now()
          UNION ALL
          SELECT concurrency_key FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND concurrency_key IS NOT NULL
            AND run_at <= now()
        ) AS due GROUP BY concurrency_key) AS k
  LEFT JOIN (SELECT concurrency_key, count(*) AS n FROM ${jobs}
             WHERE queue = $1 AND state = 'leased' AND concurrency_key IS NOT NULL GROUP BY concurrency_key) AS l
    USING (concurrency_key)
  -- A key its rate limit holds back (flow_state's lane of the key, blocked until later) takes none now.
  WHERE NOT EXISTS (SELECT 1 FROM ${flowState} AS f WHERE f.queue = $1 AND f.lane = k.concurrency_key AND f.blocked_until > now())
)
SELECT
  ((SELECT count(*) FROM ${jobs} WHERE queue = $1 AND state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now())
   + (SELECT count(*) FROM ${jobs} WHERE queue = $1 AND state = 'delayed' AND group_key IS NULL AND concurrency_key IS NULL AND run_at <= now())
   + (SELECT COALESCE(sum(CASE WHEN (SELECT concurrency_per_key FROM s) IS NULL THEN n
                               ELSE LEAST(n, GREATEST(0, (SELECT concurrency_per_key FROM s) - leased)) END), 0) FROM keyed)
   + (SELECT count(*) FROM ${groups} WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND NOT waiting)
   + (SELECT count(*) FROM ${groups} WHERE queue = $1 AND held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND waiting
        AND head_ready_at <= now()))::bigint AS claimable,
  (SELECT count(*) FROM ${jobs} WHERE queue = $1 AND state = 'leased')::bigint AS running,
  w.completed AS completed_in_window,
  w.busy_ms AS busy_ms_in_window,
  ${SCALE_WINDOW_MINUTES * 60_000}::bigint AS window_ms,
  EXISTS (SELECT 1 FROM ${pauses} WHERE queue = $1) AS paused,
  (SELECT global_concurrency FROM s) AS global_concurrency,
  (SELECT rate_max FROM s) AS rate_max,
  (SELECT rate_per_ms FROM s) AS rate_per_ms
FROM (SELECT COALESCE(sum(completed), 0)::bigint AS completed, COALESCE(sum(busy_ms), 0)::bigint AS busy_ms FROM ${throughput}
      WHERE minute >= date_trunc('minute', now()) - interval '${SCALE_WINDOW_MINUTES} minutes' AND minute < date_trunc('minute', now())
        AND queue = $1) AS w`;
}

/** The function's signature, as GRANT and REVOKE name it. */
export function pgDesiredReadersSignature(schema: string): string {
  return `${quotePgIdentifier(schema)}.desired_readers(text, integer, integer)`;
}

/**
 * `<schema>.desired_readers(queue_name, target_drain_ms, default_run_ms)`: core/scaling's desiredReaders
 * on scaleInputs, in numerics (its integer arithmetic, ⌈a / b⌉ as div(a + b - 1, b)), for KEDA's
 * postgresql scaler (targetValue: the queue's maxReaders gives pods). STABLE, SECURITY DEFINER with
 * a fixed search_path, EXECUTE revoked from PUBLIC: a scaler's login needs EXECUTE on it and USAGE
 * on the schema, no table rights. Its text is scaleInputs as it is at this release (a test pins it).
 */
export function pgDesiredReadersFunction(t: PgTables): string {
  const s = quotePgIdentifier(t.schema);
  const refuse = (what: string, min: number) =>
    `RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'desired_readers: ${what} must be an integer from ${min} up, got ' || COALESCE(${what}::text, 'null');`;
  // LEAST ignores NULLs: a limit the queue does not have caps nothing.
  return `CREATE FUNCTION ${s}.desired_readers(queue_name text, target_drain_ms integer DEFAULT 60000, default_run_ms integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $desired$
BEGIN
  IF target_drain_ms IS NULL OR target_drain_ms < 1000 THEN
    ${refuse('target_drain_ms', 1000)}
  END IF;
  IF default_run_ms IS NULL OR default_run_ms < 1 THEN
    ${refuse('default_run_ms', 1)}
  END IF;
  RETURN (
SELECT LEAST(${MAX_READERS}, CASE
    WHEN i.paused THEN i.running
    WHEN i.claimable = 0 AND i.running = 0 THEN 0
    ELSE GREATEST(CASE WHEN i.claimable > 0 THEN 1 ELSE 0 END, LEAST(
      GREATEST(i.running, div(i.busy_ms_in_window + i.window_ms - 1, i.window_ms)
                          + div(i.claimable * i.run_ms + target_drain_ms - 1, target_drain_ms)),
      i.global_concurrency,
      CASE WHEN i.rate_max IS NOT NULL AND i.rate_per_ms > 0
           THEN div(i.rate_max * i.run_ms + i.rate_per_ms - 1, i.rate_per_ms) END))
  END)::integer
FROM (
  SELECT inputs.*,
         CASE WHEN inputs.completed_in_window > 0 AND inputs.busy_ms_in_window > 0
              THEN LEAST(div(inputs.busy_ms_in_window::numeric + inputs.completed_in_window - 1, inputs.completed_in_window),
                         ${MAX_MEASURED_RUN_MS})
              ELSE default_run_ms::numeric END AS run_ms
  FROM (
${scaleInputs(t)}
  ) AS inputs
) AS i);
END;
$desired$`;
}
