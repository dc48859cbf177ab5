/**
 * Shared setup of the process drills: each drill file gets its own schema on the target's
 * database (files run in parallel), real worker processes, and proxies; everything it
 * started is stopped after each test, whether it passed or not. The drills themselves
 * (crash.drills.ts, frozen.drills.ts, lost-reply.drills.ts) run against any `DrillTarget`:
 * PostgreSQL in `npm test`, SQL Server in `npm run test:mssql` (test/integration/mssql).
 *
 * Call `useDrillSchema()` once per target at the level its drills are declared: it registers
 * the hooks.
 */
import { afterAll, afterEach, beforeAll, expect } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { uniqueSchema } from '../../helpers/databases.js';
import type { EffectsReport } from '../../helpers/drills.js';
import { waitFor } from '../../helpers/wait-for.js';
import { killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';
import type { WorkerConfig } from '../../workers/nest-worker.js';

/** Short enough that drills wait little for leases to run out, long enough that a loaded CI keeps them renewed. */
export const SHORT_LEASE_MS = 1_500;
export const REAPER_MS = 200;

/** The store statements a drill counts or intercepts on the wire. */
export type DrillStatement = 'claim' | 'heartbeat' | 'complete';

/** A proxy between one worker and the database that sees the store's statements go by. */
export interface StatementWire {
  /** The target's URL, through this proxy. */
  readonly url: string;
  /** Statements of one kind sent since `from` (ms since the epoch). */
  count(statement: DrillStatement, from?: number): number;
  /** The next connection that sends `statement`: it reaches the server, its reply never returns. */
  holdReplyAfter(statement: DrillStatement): Promise<{ serverDone: Promise<void>; cut(): void }>;
  close(): Promise<void>;
}

/** A database the drills run on: the store, the receiver's tables, raw reads and a wire proxy. */
export interface DrillTarget {
  dialect: NonNullable<WorkerConfig['dialect']>;
  url: string;
  /** A store with its own small pool in `schema` (not migrated). */
  openStore(schema: string): QueueStore;
  createEffectTables(schema: string): Promise<void>;
  /** Drops the schema with everything in it, the receiver's tables included. */
  dropSchema(schema: string): Promise<void>;
  /**
   * The raw job row, token included, with the same keys on every target (state, attempts,
   * claim_token, lease_until, worker_id, claimed_at, finished_at, last_error): "unchanged"
   * must mean unchanged to the byte.
   */
  jobRow(schema: string, id: string): Promise<Record<string, unknown>>;
  /** Every start of the job's handler, in order. */
  runsOf(schema: string, id: string): Promise<{ pid: number; attempt: number }[]>;
  /** Every attempt to write the key's business effect, in order, and whether the receiver applied it. */
  effectWritesOf(schema: string, key: string): Promise<{ pid: number; applied: boolean }[]>;
  /** The process whose effect the receiver kept for the key. */
  effectsOf(schema: string, key: string): Promise<{ pid: number }[]>;
  effectsReport(schema: string): Promise<EffectsReport>;
  /** Whether the database clock is past `since` + `ms`. */
  clockPast(since: Date, ms: number): Promise<boolean>;
  startWire(schema: string): Promise<StatementWire>;
}

export function useDrillSchema(target: DrillTarget, prefix: string) {
  const schema = uniqueSchema(prefix);
  const store = target.openStore(schema);
  const wires: StatementWire[] = [];

  beforeAll(async () => {
    await store.migrate('auto');
    await target.createEffectTables(schema);
  });
  afterEach(async () => {
    await killAllWorkers();
    await Promise.all(wires.splice(0).map((wire) => wire.close()));
  });
  afterAll(async () => {
    await killAllWorkers();
    await store.close();
    await target.dropSchema(schema);
  });

  /** A Nest worker process on one queue: one reader, fast polling, fast reaper, events forwarded. */
  function worker(queue: string, workerId: string, overrides: Partial<WorkerConfig> = {}): Promise<WorkerProcess> {
    return WorkerProcess.start({
      dialect: target.dialect,
      url: target.url,
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

  async function proxy(): Promise<StatementWire> {
    const started = await target.startWire(schema);
    wires.push(started);
    return started;
  }

  function jobDone(id: string, what: string) {
    return waitFor(
      () => store.getJob(id),
      (job) => job?.state === 'done',
      { timeoutMs: 20_000, what },
    );
  }

  /**
   * Drill 4 over every job of this file's drills: each is done and each idempotency key has
   * exactly one business effect. With `repeatsExpected`, the drills made handlers run again
   * and try their effect again, so the check is not vacuous: the receiver had to refuse.
   */
  async function expectEachEffectOnce({ repeatsExpected }: { repeatsExpected: boolean }): Promise<void> {
    const report = await target.effectsReport(schema);
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

  return {
    schema,
    store,
    worker,
    proxy,
    jobDone,
    expectEachEffectOnce,
    row: (id: string) => target.jobRow(schema, id),
    runsOf: (id: string) => target.runsOf(schema, id),
    effectWritesOf: (key: string) => target.effectWritesOf(schema, key),
    effectsOf: (key: string) => target.effectsOf(schema, key),
    clockPast: (since: Date, ms: number) => target.clockPast(since, ms),
  };
}
