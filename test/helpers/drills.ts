import { sql } from './databases.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';

/** Enqueues one job per idempotency key (payload { n }) and returns their ids in order. */
export async function enqueueKeys(store: QueueStore, queue: string, keys: readonly string[]): Promise<string[]> {
  const results = await store.enqueue(
    keys.map((idempotencyKey, n) =>
      prepareJob(queue, { n }, { idempotencyKey }, { maxPayloadBytes: 1024, defaultMaxAttempts: 25 }),
    ),
  );
  return results.map((r) => r.jobId);
}

/** What the idempotent receiver saw, over every job of a schema (see test/workers/nest-worker.ts). */
export interface EffectsReport {
  jobs: number;
  done: number;
  /** Jobs not done at all (lost, stuck leased, dead, or never claimed). */
  notDone: { id: string; state: string; key: string | null }[];
  effects: number;
  /** Idempotency keys of jobs with no effect row. */
  missingEffects: string[];
  /** Keys with more than one effect row (impossible with the unique key: a broken receiver). */
  duplicateEffects: string[];
  /** Effect rows whose key belongs to no job. */
  strayEffects: number;
  /** Handler starts, and jobs whose handler started more than once. */
  runs: number;
  jobsRunMoreThanOnce: number;
  /** Attempts to write an effect that the receiver refused because the key already had one. */
  refusedRepeats: number;
}

export async function effectsReport(url: string, schema: string): Promise<EffectsReport> {
  const s = `"${schema}"`;
  const [totals] = await sql<{ jobs: number; done: number; effects: number; runs: number; refused: number }>(
    url,
    `SELECT (SELECT count(*)::int FROM ${s}.jobs) AS jobs,
            (SELECT count(*)::int FROM ${s}.jobs WHERE state = 'done') AS done,
            (SELECT count(*)::int FROM ${s}.effects) AS effects,
            (SELECT count(*)::int FROM ${s}.runs) AS runs,
            (SELECT count(*)::int FROM ${s}.effect_writes WHERE NOT applied) AS refused`,
  );
  const notDone = await sql<{ id: string; state: string; key: string | null }>(
    url,
    `SELECT id::text AS id, state, idempotency_key AS key FROM ${s}.jobs WHERE state <> 'done' ORDER BY id LIMIT 50`,
  );
  const missing = await sql<{ key: string }>(
    url,
    `SELECT COALESCE(j.idempotency_key, 'job-' || j.id) AS key FROM ${s}.jobs j
     WHERE NOT EXISTS (SELECT 1 FROM ${s}.effects e WHERE e.idempotency_key = COALESCE(j.idempotency_key, 'job-' || j.id))
     ORDER BY j.id LIMIT 50`,
  );
  const duplicates = await sql<{ key: string }>(
    url,
    `SELECT idempotency_key AS key FROM ${s}.effects GROUP BY idempotency_key HAVING count(*) > 1 LIMIT 50`,
  );
  const [stray] = await sql<{ n: number }>(
    url,
    `SELECT count(*)::int AS n FROM ${s}.effects e
     WHERE NOT EXISTS (SELECT 1 FROM ${s}.jobs j WHERE COALESCE(j.idempotency_key, 'job-' || j.id) = e.idempotency_key)`,
  );
  const [reruns] = await sql<{ n: number }>(
    url,
    `SELECT count(*)::int AS n FROM (SELECT job_id FROM ${s}.runs GROUP BY job_id HAVING count(*) > 1) r`,
  );
  return {
    jobs: totals!.jobs,
    done: totals!.done,
    notDone,
    effects: totals!.effects,
    missingEffects: missing.map((r) => r.key),
    duplicateEffects: duplicates.map((r) => r.key),
    strayEffects: stray!.n,
    runs: totals!.runs,
    jobsRunMoreThanOnce: reruns!.n,
    refusedRepeats: totals!.refused,
  };
}

/** Attempt history as 'attempt:outcome:workerId' strings, for readable equality checks. */
export function attemptSummary(attempts: { attempt: number; outcome: string; workerId: string | null }[]) {
  return attempts.map((a) => `${a.attempt}:${a.outcome}:${a.workerId}`);
}

/** Rejects with a message naming what did not happen, so no wait in a drill can hang CI. */
export function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
