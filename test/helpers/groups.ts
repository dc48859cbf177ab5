import pg from 'pg';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { ClaimedJob, EnqueueOptions, NewJob, OwnedJob } from '../../lib/src/core/types.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { sql } from './databases.js';

/**
 * Shared by the ordered-group proofs on PostgreSQL (test/integration/groups-*.postgres.spec.ts):
 * the design (a) predicate as an oracle over the groups table, the handler spans the group
 * workers record, and small job helpers.
 */

const LIMITS = { maxPayloadBytes: 64 * 1024, defaultMaxAttempts: 5 };

export function groupJob(queue: string, groupKey: string | null, payload: unknown = {}, options: EnqueueOptions = {}) {
  return prepareJob(queue, payload, groupKey === null ? options : { ...options, groupKey }, LIMITS);
}

export async function enqueueIds(store: QueueStore, jobs: readonly NewJob[], transaction?: unknown): Promise<string[]> {
  return (await store.enqueue(jobs, transaction)).map((r) => r.jobId);
}

export function owned(jobs: readonly ClaimedJob[]): OwnedJob[] {
  return jobs.map(({ id, claimToken }) => ({ id, claimToken }));
}

export function idsOf(jobs: readonly { id: string }[]): string[] {
  return jobs.map((j) => j.id);
}

/** Job ids in numeric order (they are decimal strings). */
export function sortIds(ids: readonly string[]): string[] {
  return [...ids].sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : BigInt(a) > BigInt(b) ? 1 : 0));
}

interface OracleRow extends Record<string, unknown> {
  queue: string;
  group_key: string;
  has_row: boolean;
  head_id: string | null;
  held_token: string | null;
  blocked: boolean | null;
  first_unfinished: string | null;
  leased: number | null;
  lease_tokens: number | null;
  lease_token: string | null;
  head_state: string | null;
  head_in_group: boolean | null;
  head_cache_matches: boolean | null;
}

/**
 * The cached state of ordered groups checked against their jobs (design (a)'s predicate: the
 * head of an unheld group is its lowest unfinished job), one line per disagreement; empty when
 * they agree. Run it when the groups are at rest (no transition in flight on them).
 * - a group with unfinished jobs has a row;
 * - its leased jobs share one token, and the row is held by that token exactly while any is leased;
 * - an unheld, unblocked group's head is its lowest unfinished job, with that job's run-at and
 *   priority cached; a row without unfinished jobs is idle (no head, not held) or deleted;
 * - a held group's head is at or before its lowest unfinished job (batch members that finished
 *   first do not move it);
 * - a blocked group is not held and its head is a dead job of the group.
 * `db` is a URL (a connection for this one query) or a connected client.
 */
export async function groupDisagreements(
  db: string | pg.Client,
  schema: string,
  filter: { queue?: string; groupKeys?: readonly string[] } = {},
): Promise<string[]> {
  const s = `"${schema}"`;
  const query = async (text: string, params: unknown[]) =>
    typeof db === 'string' ? sql<OracleRow>(db, text, params) : (await db.query<OracleRow>(text, params)).rows;
  const rows = await query(
    `WITH unfinished AS (
       SELECT queue, group_key, min(id) AS first_id,
              count(*) FILTER (WHERE state = 'leased')::int AS leased,
              count(DISTINCT claim_token) FILTER (WHERE state = 'leased')::int AS lease_tokens,
              min(claim_token::text) FILTER (WHERE state = 'leased') AS lease_token
       FROM ${s}.jobs
       WHERE group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased')
         AND ($1::text IS NULL OR queue = $1) AND ($2::text[] IS NULL OR group_key = ANY ($2))
       GROUP BY queue, group_key
     ), keyset AS (
       SELECT queue, group_key FROM unfinished
       UNION
       SELECT queue, group_key FROM ${s}.groups
       WHERE ($1::text IS NULL OR queue = $1) AND ($2::text[] IS NULL OR group_key = ANY ($2))
     )
     SELECT k.queue, k.group_key, g.queue IS NOT NULL AS has_row,
            g.head_id::text AS head_id, g.held_token::text AS held_token, g.blocked,
            u.first_id::text AS first_unfinished, u.leased, u.lease_tokens, u.lease_token,
            h.state AS head_state, (h.queue = k.queue AND h.group_key = k.group_key) AS head_in_group,
            (g.head_ready_at IS NOT DISTINCT FROM h.run_at AND g.head_priority IS NOT DISTINCT FROM h.priority)
              AS head_cache_matches
     FROM keyset k
     LEFT JOIN ${s}.groups g ON g.queue = k.queue AND g.group_key = k.group_key
     LEFT JOIN unfinished u ON u.queue = k.queue AND u.group_key = k.group_key
     LEFT JOIN ${s}.jobs h ON h.id = g.head_id
     ORDER BY k.queue, k.group_key`,
    [filter.queue ?? null, filter.groupKeys ? [...filter.groupKeys] : null],
  );
  const problems: string[] = [];
  for (const r of rows) {
    const at = `group '${r.group_key}' of ${r.queue}`;
    const problem = (text: string) => problems.push(`${at}: ${text}`);
    const leased = r.leased ?? 0;
    if (!r.has_row) {
      if (r.first_unfinished !== null) problem(`no group row, unfinished jobs from ${r.first_unfinished}`);
      continue;
    }
    if ((r.lease_tokens ?? 0) > 1) problem(`jobs leased under ${r.lease_tokens} tokens at once`);
    if (leased > 0 && r.held_token !== r.lease_token) {
      problem(`held by ${r.held_token ?? 'nobody'} while its jobs are leased with ${r.lease_token}`);
    }
    if (leased === 0 && r.held_token !== null) problem(`held by ${r.held_token} with no job leased`);
    if (r.head_id !== null && r.head_in_group !== true) problem(`head ${r.head_id} is not a job of the group`);
    if (r.blocked) {
      if (r.head_state !== 'dead') problem(`blocked on head ${r.head_id} in state ${r.head_state}`);
      continue;
    }
    if (r.held_token !== null) {
      if (r.head_id === null) problem('held with no head');
      else if (r.first_unfinished !== null && BigInt(r.head_id) > BigInt(r.first_unfinished)) {
        problem(`held with head ${r.head_id} past the first unfinished job ${r.first_unfinished}`);
      }
      continue;
    }
    if (r.head_id !== r.first_unfinished) {
      problem(`head ${r.head_id ?? 'none'}, first unfinished job ${r.first_unfinished ?? 'none'}`);
    } else if (r.head_id !== null && !r.head_cache_matches) {
      problem(`head ${r.head_id}: cached run-at or priority differs from the job's`);
    }
  }
  return problems;
}

/** The group rows of a schema, as the tests read them. */
export interface GroupRow extends Record<string, unknown> {
  queue: string;
  group_key: string;
  head_id: string | null;
  held_token: string | null;
  blocked: boolean;
}

export async function groupRows(url: string, schema: string, queue: string): Promise<GroupRow[]> {
  return sql<GroupRow>(
    url,
    `SELECT queue, group_key, head_id::text AS head_id, held_token::text AS held_token, blocked
     FROM "${schema}".groups WHERE queue = $1 ORDER BY group_key`,
    [queue],
  );
}

/** The table the group workers (test/workers/group-worker.ts) record each handler run in. */
export async function createSpanTable(url: string, schema: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
    // Database clock at both ends (one clock for every process); ended_at is written by the
    // handler itself before it returns, so a recorded span lies within the handler's run.
    await client.query(
      `CREATE TABLE IF NOT EXISTS "${schema}".spans (
         span_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         job_id bigint NOT NULL, queue text NOT NULL, group_key text NULL, pid int NOT NULL, attempt int NOT NULL,
         started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz NULL)`,
    );
  } finally {
    await client.end();
  }
}

/**
 * Per group, handler runs that started before the previous one (by start time) had ended, or
 * that ran a lower id after a higher one; and runs that never ended. Empty when every group ran
 * one job at a time in id order.
 */
export async function spanViolations(url: string, schema: string, queue: string): Promise<string[]> {
  const rows = await sql<{ line: string }>(
    url,
    `SELECT format('group %s: job %s (%s..%s) after job %s (%s..%s)', group_key, job_id, started_at, ended_at,
                   prev_id, prev_start, prev_end) AS line
     FROM (
       SELECT group_key, job_id, started_at, ended_at,
              lag(job_id) OVER w AS prev_id, lag(started_at) OVER w AS prev_start, lag(ended_at) OVER w AS prev_end
       FROM "${schema}".spans WHERE queue = $1 AND group_key IS NOT NULL
       WINDOW w AS (PARTITION BY group_key ORDER BY started_at, span_id)
     ) s
     WHERE ended_at IS NULL OR prev_end IS NULL AND prev_id IS NOT NULL
        OR prev_id >= job_id OR prev_end > started_at
     ORDER BY group_key, started_at
     LIMIT 20`,
    [queue],
  );
  return rows.map((r) => r.line);
}

export interface SpanTotals extends Record<string, unknown> {
  spans: number;
  jobs: number;
  /** First start to last end, ms. */
  wallMs: number;
  /** Sum of every run's length, ms: the time one reader would have needed. */
  serialMs: number;
}

export async function spanTotals(url: string, schema: string, queue: string): Promise<SpanTotals> {
  const [row] = await sql<SpanTotals>(
    url,
    `SELECT count(*)::int AS spans, count(DISTINCT job_id)::int AS jobs,
            (extract(epoch FROM max(ended_at) - min(started_at)) * 1000)::float8 AS "wallMs",
            (extract(epoch FROM sum(ended_at - started_at)) * 1000)::float8 AS "serialMs"
     FROM "${schema}".spans WHERE queue = $1`,
    [queue],
  );
  return row!;
}
