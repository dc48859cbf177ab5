/**
 * Shared setup of the process drills on the shared PostgreSQL: each drill file gets its own
 * schema (files run in parallel), real worker processes, and proxies; everything it started
 * is stopped after each test, whether it passed or not.
 *
 * Call `useDrillSchema()` once at the top level of a spec file: it registers the hooks.
 */
import { afterAll, afterEach, beforeAll, expect } from 'vitest';
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../../helpers/databases.js';
import { effectsReport } from '../../helpers/drills.js';
import { sql } from '../../helpers/databases.js';
import { PgProxy } from '../../helpers/pg-proxy.js';
import { waitFor } from '../../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';
import type { WorkerConfig } from '../../workers/nest-worker.js';

/** Short enough that drills wait little for leases to run out, long enough that a loaded CI keeps them renewed. */
export const SHORT_LEASE_MS = 1_500;
export const REAPER_MS = 200;

export function useDrillSchema(prefix: string) {
  const schema = uniqueSchema(prefix);
  const store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
  const proxies: PgProxy[] = [];

  beforeAll(async () => {
    await store.migrate('auto');
    await createEffectTables(PG_URL, schema);
  });
  afterEach(async () => {
    await killAllWorkers();
    await Promise.all(proxies.splice(0).map((proxy) => proxy.close()));
  });
  afterAll(async () => {
    await killAllWorkers();
    await store.close();
    await dropPgSchema(schema);
  });

  /** A Nest worker process on one queue: one reader, fast polling, fast reaper, events forwarded. */
  function worker(queue: string, workerId: string, overrides: Partial<WorkerConfig> = {}): Promise<WorkerProcess> {
    return WorkerProcess.start({
      url: PG_URL,
      schema,
      queue,
      workerId,
      minReaders: 1,
      maxReaders: 1,
      minPollMs: 20,
      maxPollMs: 200,
      reaperIntervalMs: REAPER_MS,
      events: true,
      ...overrides,
    });
  }

  async function proxy(): Promise<PgProxy> {
    const started = await PgProxy.start(PG_URL);
    proxies.push(started);
    return started;
  }

  /** The raw row, token included: "unchanged" must mean unchanged to the byte. */
  async function row(id: string) {
    const [found] = await sql(
      PG_URL,
      `SELECT state, attempts, claim_token::text AS claim_token, lease_until, worker_id, claimed_at, finished_at, last_error
       FROM "${schema}".jobs WHERE id = $1`,
      [id],
    );
    return found!;
  }

  function jobDone(id: string, what: string) {
    return waitFor(
      () => store.getJob(id),
      (job) => job?.state === 'done',
      { timeoutMs: 20_000, what },
    );
  }

  /** Every start of the job's handler, in order. */
  function runsOf(id: string) {
    return sql<{ pid: number; attempt: number }>(
      PG_URL,
      `SELECT pid, attempt FROM "${schema}".runs WHERE job_id = $1 ORDER BY at`,
      [id],
    );
  }

  /** Every attempt to write the key's business effect, and whether the receiver applied it. */
  function effectWritesOf(key: string) {
    return sql<{ pid: number; applied: boolean }>(
      PG_URL,
      `SELECT pid, applied FROM "${schema}".effect_writes WHERE idempotency_key = $1 ORDER BY at`,
      [key],
    );
  }

  /**
   * Drill 4 over every job of this file's drills: each is done and each idempotency key has
   * exactly one business effect. With `repeatsExpected`, the drills made handlers run again
   * and try their effect again, so the check is not vacuous: the receiver had to refuse.
   */
  async function expectEachEffectOnce({ repeatsExpected }: { repeatsExpected: boolean }): Promise<void> {
    const report = await effectsReport(PG_URL, schema);
    expect(report.jobs).toBeGreaterThan(0);
    expect(report.notDone).toEqual([]);
    expect(report.missingEffects).toEqual([]);
    expect(report.duplicateEffects).toEqual([]);
    expect(report.strayEffects).toBe(0);
    expect(report.effects).toBe(report.jobs);
    if (repeatsExpected) {
      expect(report.jobsRunMoreThanOnce).toBeGreaterThan(0);
      expect(report.refusedRepeats).toBeGreaterThan(0);
    }
  }

  return { schema, store, worker, proxy, row, jobDone, runsOf, effectWritesOf, expectEachEffectOnce };
}
