// Enqueue from SQL: the function migrations install (<schema>.enqueue), which validates as
// prepareJob does, with the same messages, and runs the store's own enqueue statements.
import { MAX_DELAY_MS, SCHEDULE_KEY_PREFIX } from '../../../core/producer/index.js';
import {
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_MAX_PAYLOAD_BYTES,
  KEY_MAX_LENGTH,
  MAX_ATTEMPTS_LIMIT,
  QUEUE_NAME_PATTERN,
  WHITESPACE_CODE_POINTS,
} from '../../../core/validation.js';
import { quotePgIdentifier, pgWakeChannel } from '../postgres.identifiers.js';
import { enqueueOne, findByIdempotencyKeys } from './enqueue.queries.js';
import { touchLock, touchMove } from './groups.queries.js';
import type { PgTables } from './tables.js';

/** The function's signature, as GRANT and REVOKE name it. */
export function pgEnqueueSignature(schema: string): string {
  return `${quotePgIdentifier(schema)}.enqueue(text, jsonb, text, text, bigint, integer, integer, timestamptz, text)`;
}

/** A SQL string literal. */
function literal(text: string): string {
  return `'${text.replace(/'/g, "''")}'`;
}

/**
 * describe() of core/validation.ts in SQL: 'text' (cut after 60 UTF-16 code units, as JavaScript's
 * slice cuts, with …), or null.
 */
function describeText(expression: string): string {
  const first60Units = `(SELECT string_agg(u.c, '' ORDER BY u.i) FROM (
      SELECT c, i, sum(CASE WHEN ascii(c) > 65535 THEN 2 ELSE 1 END) OVER (ORDER BY i) AS units
      FROM unnest(string_to_array(${expression}, NULL)) WITH ORDINALITY AS a(c, i)) AS u WHERE u.units <= 60)`;
  return `CASE WHEN ${expression} IS NULL THEN 'null' ELSE '''' || CASE WHEN ${utf16Length(expression)} > 60 THEN ${first60Units} || chr(8230) ELSE ${expression} END || '''' END`;
}

/** A text's length in UTF-16 code units, as JavaScript counts it (characters past U+FFFF are two). */
function utf16Length(expression: string): string {
  return `(char_length(${expression}) + char_length(regexp_replace(${expression}, '[^\\U00010000-\\U0010FFFF]', '', 'g')))`;
}

function refuse(message: string): string {
  return `RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = ${message};`;
}

/** The key checks of assertKeyText (core/validation.ts); PostgreSQL text cannot hold U+0000 or a lone surrogate. */
function keyChecks(parameter: string, name: string): string {
  const whitespace = WHITESPACE_CODE_POINTS.map((code) => `\\u${code.toString(16).padStart(4, '0')}`).join('');
  return `  IF ${parameter} IS NOT NULL THEN
    IF ${parameter} = '' OR ${utf16Length(parameter)} > ${KEY_MAX_LENGTH} THEN
      ${refuse(`at_ || ${literal(`: ${name} must be a non-empty string of at most ${KEY_MAX_LENGTH} characters, got `)} || ${describeText(parameter)}`)}
    END IF;
    IF ${parameter} ~ '[${whitespace}]$' THEN
      ${refuse(`at_ || ${literal(`: ${name} must not end with whitespace, got `)} || ${describeText(parameter)}`)}
    END IF;
  END IF;
`;
}

/**
 * `<schema>.enqueue(queue, payload, idempotency_key, group_key, delay_ms, priority, max_attempts,
 * run_at, concurrency_key)`, returning (job_id, created): producer.enqueue in the caller's
 * transaction, for triggers, procedures and scripts. The checks run in prepareJob's order with its
 * messages (a test holds them equal), then the store's own statements: the insert with its
 * idempotency key (rounds, as enqueueOne in the store: a key whose job was deleted meanwhile is
 * inserted again), the ordered group's touch, and the NOTIFY that wakes consumers at commit. The
 * queue's recorded maxAttempts applies when none is given, else the library's default; the payload
 * limit is the default maxPayloadBytes. A NULL payload is JSON null. SECURITY DEFINER with a fixed
 * search_path, so a role needs only EXECUTE on it (and USAGE on the schema), never the tables;
 * EXECUTE is revoked from PUBLIC.
 */
export function pgEnqueueFunction(t: PgTables): string {
  const s = quotePgIdentifier(t.schema);
  const where = `${literal('enqueue to ')} || quote_literal(queue)`;
  return `CREATE FUNCTION ${s}.enqueue(
  queue text,
  payload jsonb,
  idempotency_key text DEFAULT NULL,
  group_key text DEFAULT NULL,
  delay_ms bigint DEFAULT NULL,
  priority integer DEFAULT NULL,
  max_attempts integer DEFAULT NULL,
  run_at timestamptz DEFAULT NULL,
  concurrency_key text DEFAULT NULL,
  OUT job_id bigint,
  OUT created boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $enqueue$
DECLARE
  at_ text;
  bytes_ bigint;
  id_ text;
  found_queue_ text;
  found_key_ text;
  lock_status_ text;
  lock_key_ text;
  lock_id_ text;
BEGIN
  IF queue IS NULL OR queue !~ ${literal(QUEUE_NAME_PATTERN)} THEN
    ${refuse(`'queue name ' || ${describeText('queue')} || ${literal(` is invalid: use letters, digits, '.', '-', '_' (1 to 128 characters)`)}`)}
  END IF;
  at_ := ${where};
  bytes_ := octet_length(COALESCE(payload, 'null'::jsonb)::text);
  IF bytes_ > ${DEFAULT_MAX_PAYLOAD_BYTES} THEN
    ${refuse(`at_ || ': payload is ' || bytes_ || ${literal(` bytes of JSON, over the limit of ${DEFAULT_MAX_PAYLOAD_BYTES} (store large documents elsewhere and enqueue a reference)`)}`)}
  END IF;
  IF run_at IS NOT NULL AND delay_ms IS NOT NULL THEN
    ${refuse(`at_ || ': give runAt or delayMs, not both'`)}
  END IF;
  IF run_at IS NOT NULL AND NOT isfinite(run_at) THEN
    ${refuse(`at_ || ': runAt must be a valid Date'`)}
  END IF;
  IF delay_ms IS NOT NULL AND (delay_ms < 0 OR delay_ms > ${MAX_DELAY_MS}) THEN
    ${refuse(`at_ || ${literal(`: delayMs must be an integer from 0 to ${MAX_DELAY_MS}, got `)} || delay_ms`)}
  END IF;
  IF priority IS NOT NULL AND (priority < -32768 OR priority > 32767) THEN
    ${refuse(`at_ || ': priority must be an integer from -32768 to 32767, got ' || priority`)}
  END IF;
  IF max_attempts IS NOT NULL AND (max_attempts < 1 OR max_attempts > ${MAX_ATTEMPTS_LIMIT}) THEN
    ${refuse(`at_ || ${literal(`: maxAttempts must be an integer from 1 to ${MAX_ATTEMPTS_LIMIT}, got `)} || max_attempts`)}
  END IF;
${keyChecks('group_key', 'groupKey')}${keyChecks('concurrency_key', 'concurrencyKey')}  IF group_key IS NOT NULL AND concurrency_key IS NOT NULL THEN
    ${refuse(`at_ || ': give groupKey or concurrencyKey, not both (an ordered group already runs one job at a time)'`)}
  END IF;
${keyChecks('idempotency_key', 'idempotencyKey')}  IF starts_with(idempotency_key, ${literal(SCHEDULE_KEY_PREFIX)}) THEN
    ${refuse(`at_ || ': idempotencyKey ''' || idempotency_key || ${literal(`' starts with '${SCHEDULE_KEY_PREFIX}', which is reserved for the jobs of recurring schedules: choose another key`)}`)}
  END IF;

  created := false;
  FOR round_ IN 1..5 LOOP
    id_ := NULL;
    EXECUTE $statement$${enqueueOne(t)}$statement$
      INTO id_
      USING queue, COALESCE(payload, 'null'::jsonb), COALESCE(priority, 0), run_at, COALESCE(delay_ms, 0)::float8,
            group_key, idempotency_key, max_attempts, ${DEFAULT_MAX_ATTEMPTS}, NULL::text, concurrency_key;
    IF id_ IS NOT NULL THEN
      created := true;
      EXIT;
    END IF;
    -- The key's job committed before ours (ON CONFLICT waited for it); deleted meanwhile, insert again.
    EXECUTE $statement$${findByIdempotencyKeys(t)}$statement$
      INTO found_queue_, found_key_, id_
      USING jsonb_build_array(jsonb_build_object('queue', queue, 'key', idempotency_key));
    EXIT WHEN id_ IS NOT NULL;
  END LOOP;
  IF id_ IS NULL THEN
    RAISE EXCEPTION 'idempotent enqueue did not settle: the key kept being deleted';
  END IF;
  job_id := id_::bigint;
  IF NOT created THEN
    RETURN;
  END IF;

  IF group_key IS NOT NULL THEN
    -- The job joins its ordered group, as the store's touchGroups does for one job.
    FOR round_ IN 1..5 LOOP
      lock_status_ := NULL;
      EXECUTE $statement$${touchLock(t)}$statement$
        INTO lock_key_, lock_id_, lock_status_
        USING queue, ARRAY[group_key], ARRAY[job_id];
      EXIT WHEN lock_status_ IS DISTINCT FROM 'missing';
    END LOOP;
    IF lock_status_ = 'missing' THEN
      RAISE EXCEPTION 'ordered groups did not settle: 1 group(s) kept being created or deleted';
    END IF;
    IF lock_status_ = 'locked' THEN
      EXECUTE $statement$${touchMove(t)}$statement$
        USING queue, ARRAY[group_key], ARRAY[job_id], ARRAY[]::text[], ARRAY[]::bigint[];
    END IF;
  END IF;
  -- Delivered when the caller's transaction commits, never for one that rolls back.
  PERFORM pg_notify(${literal(pgWakeChannel(t.schema))}, queue);
END;
$enqueue$`;
}
