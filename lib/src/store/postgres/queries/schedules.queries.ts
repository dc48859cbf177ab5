// Recurring jobs: due schedules, the fire's lock and advance, upsert, get, list, delete, pause.
import type { PgTables } from './tables.js';

// The scheduler's idle poll, one autocommit statement: the database's now, and the ms until
// the earliest unpaused schedule is due (<= 0: due; null: none). min() reads one end of
// schedules_due_ix. Rounded up, so a positive answer is never due yet.
export function scheduleDueIn(t: PgTables): string {
  const { schedules } = t;
  return `SELECT now() AS now,
       ceil(extract(epoch FROM (SELECT min(next_run_at) FROM ${schedules}
                                WHERE NOT paused AND next_run_at IS NOT NULL) - now()) * 1000)::float8 AS due_in_ms`;
}

// $1 limit. In fireDueSchedules' transaction: locks the due schedules no other instance
// holds, earliest first; a row another instance is firing is skipped, and one it fired
// meanwhile is re-checked on its new next_run_at and left out. now() is the transaction's
// time, the same in the advance that follows.
export function scheduleLockDue(t: PgTables): string {
  const { schedules } = t;
  return `SELECT ${SCHEDULE_COLUMNS}, now() AS db_now
FROM ${schedules}
WHERE NOT paused AND next_run_at IS NOT NULL AND next_run_at <= now()
ORDER BY next_run_at
LIMIT $1
FOR UPDATE SKIP LOCKED`;
}

// $1 jsonb [{id, next_run_at, last_tick, fired}], the schedules locked by scheduleLockDue.
// A firing that enqueued no job (every missed tick skipped) moves next_run_at only: the last
// run and its tick are those of the last job enqueued.
export function scheduleAdvance(t: PgTables): string {
  const { schedules } = t;
  return `UPDATE ${schedules} AS s
SET next_run_at = u.next_run_at,
    last_run_at = CASE WHEN u.fired THEN now() ELSE s.last_run_at END,
    last_tick = CASE WHEN u.fired THEN u.last_tick ELSE s.last_tick END,
    updated_at = now()
FROM jsonb_to_recordset($1::jsonb) AS u(id text, next_run_at timestamptz, last_tick timestamptz, fired boolean)
WHERE s.id = u.id`;
}

// $1 jsonb [{id, queue, cron, timezone, payload, options, catch_up, source, next_run_at}], one
// entry per id, in id order (concurrent boots lock the same rows in the same order). The
// primary key makes a concurrent insert of the same id wait, then update: one row. An existing
// schedule keeps its next_run_at unless its cron or time zone changed, and its paused flag.
export function scheduleUpsert(t: PgTables): string {
  const { schedules } = t;
  return `INSERT INTO ${schedules} AS s (id, queue, cron, timezone, payload, options, catch_up, source, next_run_at,
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
    cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, updated_at = EXCLUDED.updated_at`;
}

// $1 source, $2 text[] ids to keep: deletes the other schedules of that source.
export function schedulePrune(t: PgTables): string {
  const { schedules } = t;
  return `DELETE FROM ${schedules} WHERE source = $1 AND NOT (id = ANY($2::text[]))`;
}

// $1 id
export function scheduleGet(t: PgTables): string {
  const { schedules } = t;
  return `SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} WHERE id = $1`;
}

export function scheduleList(t: PgTables): string {
  const { schedules } = t;
  return `SELECT ${SCHEDULE_COLUMNS} FROM ${schedules} ORDER BY id`;
}

// $1 id
export function scheduleDelete(t: PgTables): string {
  const { schedules } = t;
  return `DELETE FROM ${schedules} WHERE id = $1 RETURNING id`;
}

// $1 id, $2 paused, $3 next_run_at for a resume. Only a paused schedule that resumes takes
// $3 (it does not catch up its paused period); pausing, or resuming one that runs, keeps the
// time it has, so a tick due right now is not skipped.
export function schedulePause(t: PgTables): string {
  const { schedules } = t;
  return `UPDATE ${schedules}
SET next_run_at = CASE WHEN paused AND NOT $2::boolean THEN $3::timestamptz ELSE next_run_at END,
    paused = $2::boolean, updated_at = now()
WHERE id = $1
RETURNING id`;
}

const SCHEDULE_COLUMNS = `id, queue, cron, timezone, payload, options, catch_up, paused, source, next_run_at,
  last_run_at, last_tick, created_at, updated_at`;
