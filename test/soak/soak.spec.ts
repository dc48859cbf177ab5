/**
 * Soak (issue 4): 20,000 jobs, 4 worker processes, one killed with SIGKILL at random every
 * few seconds and replaced, and one database restart in the middle, on a private PostgreSQL
 * server. Prints and asserts: jobs done, duplicated business effects (0), lost jobs (0), the
 * longest a job stayed leased after its worker died, and the total time.
 *
 * Runs only under `npm run test:soak` (SQLQUEUE_SOAK=1); `npm test` skips it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../lib/src/store/postgres/postgres.store.js';
import { uniqueSchema } from '../helpers/databases.js';
import { effectsReport, enqueueKeys } from '../helpers/drills.js';
import { sql } from '../helpers/databases.js';
import { PrivatePostgres } from '../helpers/private-postgres.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../helpers/worker-process.js';
import type { WorkerConfig } from '../workers/nest-worker.js';

const JOBS = Number(process.env.SQLQUEUE_SOAK_JOBS ?? 20_000);
const WORKERS = 4;
const LEASE_MS = 3_000;
const REAPER_MS = 500;
const OUTAGE_MS = 2_000;
/** A kill every 2 to 4 s. */
const KILL_EVERY_MS: [number, number] = [2_000, 4_000];
const DEADLINE_MS = 12 * 60_000;

const schema = uniqueSchema('soak');
let server: PrivatePostgres | null = null;
let store: PostgresQueueStore | null = null;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const between = ([min, max]: [number, number]) => min + Math.random() * (max - min);

describe.skipIf(!process.env.SQLQUEUE_SOAK)('soak', () => {
  beforeAll(async () => {
    server = await PrivatePostgres.start();
    store = createPostgresStore({ url: server.url, poolSize: 4 }, { schema });
    await store.migrate('auto');
    await createEffectTables(server.url, schema);
  });

  afterAll(async () => {
    await killAllWorkers();
    await store?.close().catch(() => undefined);
    server?.destroy();
  });

  it(
    `${JOBS} jobs, ${WORKERS} workers killed at random, one database restart: every job done once`,
    { timeout: DEADLINE_MS + 120_000 },
    async () => {
      const db = server!;
      const queue = 'soak';
      const startedAt = Date.now();
      const keys = Array.from({ length: JOBS }, (_, n) => `soak-${n}`);
      for (let i = 0; i < keys.length; i += 1_000) await enqueueKeys(store!, queue, keys.slice(i, i + 1_000));

      let generation = 0;
      const config = (): WorkerConfig => ({
        url: db.url,
        schema,
        queue,
        workerId: `soak-${++generation}`,
        leaseMs: LEASE_MS,
        minReaders: 2,
        maxReaders: 6,
        minPollMs: 20,
        maxPollMs: 500,
        reaperIntervalMs: REAPER_MS,
        handlerDelayMs: 15,
      });
      const live: { worker: WorkerProcess; workerId: string }[] = [];
      const booting = new Set<Promise<void>>();
      // A replacement boots in the background, so the kills keep their pace.
      const launch = (): Promise<void> => {
        const c = config();
        const boot = WorkerProcess.start(c).then((worker) => {
          live.push({ worker, workerId: c.workerId! });
        });
        booting.add(boot);
        void boot.finally(() => booting.delete(boot)).catch(() => undefined);
        return boot;
      };
      await Promise.all(Array.from({ length: WORKERS }, launch));

      const kills: { workerId: string; at: number }[] = [];
      let restart: { downAt: number; upAt: number } | null = null;
      const remaining = async () => {
        const s = await store!.stats(queue);
        return s.ready + s.delayed + s.leased;
      };

      while ((await remaining()) > 0) {
        if (Date.now() - startedAt > DEADLINE_MS) throw new Error(`soak did not finish in ${DEADLINE_MS} ms`);
        await sleep(between(KILL_EVERY_MS));
        const [{ n: done }] = (await sql<{ n: number }>(
          db.url,
          `SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'done'`,
        )) as [{ n: number }];
        if (done >= JOBS) break;
        if (!restart && done >= JOBS / 2) {
          // The restart, in the middle of the run; no worker is replaced while the server is
          // down (a new one could not boot), so kills and the outage do not overlap.
          await Promise.all(booting);
          const downAt = Date.now();
          db.stopServer('immediate');
          await sleep(OUTAGE_MS);
          const upAt = Date.now();
          db.startServer();
          restart = { downAt, upAt };
          continue;
        }
        if (live.length === 0) continue;
        const victim = live.splice(Math.floor(Math.random() * live.length), 1)[0]!;
        victim.worker.kill('SIGKILL');
        kills.push({ workerId: victim.workerId, at: Date.now() });
        await victim.worker.exited;
        void launch();
      }
      const drainedAt = Date.now();
      await Promise.all(booting);
      await Promise.all(live.map(({ worker }) => worker.stop()));

      // Jobs a killed worker held: how long each stayed leased after the kill, until the reaper
      // returned it (lease-expired attempt) and until another worker claimed it again.
      const killedAt = new Map(kills.map((k) => [k.workerId, k.at]));
      const expired = await sql<{ worker_id: string; reaped_at: Date; reclaimed_at: Date | null }>(
        db.url,
        `SELECT a.worker_id, a.finished_at AS reaped_at,
                COALESCE((SELECT b.started_at FROM "${schema}".attempts b WHERE b.job_id = a.job_id AND b.attempt = a.attempt + 1),
                         (SELECT j.claimed_at FROM "${schema}".jobs j WHERE j.id = a.job_id AND j.attempts = a.attempt + 1)) AS reclaimed_at
         FROM "${schema}".attempts a
         WHERE a.outcome = 'lease-expired' AND a.worker_id = ANY($1)`,
        [[...killedAt.keys()]],
      );
      let maxLeasedAfterDeathMs = 0;
      let maxUntilReclaimedMs = 0;
      // Kills whose lease could run out while the database was down wait for it to come back.
      let maxLeasedAfterDeathAwayFromRestartMs = 0;
      const nearRestart = (diedAt: number) =>
        restart !== null && diedAt + LEASE_MS + REAPER_MS >= restart.downAt && diedAt <= restart.upAt;
      for (const row of expired) {
        const diedAt = killedAt.get(row.worker_id)!;
        const leasedMs = row.reaped_at.getTime() - diedAt;
        maxLeasedAfterDeathMs = Math.max(maxLeasedAfterDeathMs, leasedMs);
        if (!nearRestart(diedAt)) {
          maxLeasedAfterDeathAwayFromRestartMs = Math.max(maxLeasedAfterDeathAwayFromRestartMs, leasedMs);
        }
        if (row.reclaimed_at) maxUntilReclaimedMs = Math.max(maxUntilReclaimedMs, row.reclaimed_at.getTime() - diedAt);
      }
      // Other lost attempts: leases of live workers that ran out (heartbeats failing while the
      // database was down) and handlers that failed (their effect write hit the outage).
      const [otherAttempts] = await sql<{ expired: number; failed: number }>(
        db.url,
        `SELECT count(*) FILTER (WHERE outcome = 'lease-expired' AND NOT (worker_id = ANY($1)))::int AS expired,
                count(*) FILTER (WHERE outcome = 'failed')::int AS failed
         FROM "${schema}".attempts`,
        [[...killedAt.keys()]],
      );
      const report = await effectsReport(db.url, schema);
      const [duplicates] = await sql<{ n: number }>(
        db.url,
        `SELECT (count(*) - count(DISTINCT idempotency_key))::int AS n FROM "${schema}".effects`,
      );
      const lost = report.jobs - report.done + report.missingEffects.length;
      const summary = {
        jobs: JOBS,
        jobsDone: report.done,
        duplicateBusinessEffects: duplicates!.n,
        lostJobs: lost,
        handlerRuns: report.runs,
        jobsRunMoreThanOnce: report.jobsRunMoreThanOnce,
        repeatedEffectsRefusedByReceiver: report.refusedRepeats,
        workersKilled: kills.length,
        jobsReapedFromKilledWorkers: expired.length,
        leaseExpiriesOfLiveWorkers: otherAttempts!.expired,
        failedAttempts: otherAttempts!.failed,
        maxLeasedAfterWorkerDiedMs: maxLeasedAfterDeathMs,
        maxUntilReclaimedAfterWorkerDiedMs: maxUntilReclaimedMs,
        maxLeasedAfterWorkerDiedAwayFromRestartMs: maxLeasedAfterDeathAwayFromRestartMs,
        killsNearRestart: kills.filter((k) => nearRestart(k.at)).length,
        databaseDownMs: restart ? restart.upAt - restart.downAt : null,
        totalMs: drainedAt - startedAt,
        jobsPerSecond: Math.round(JOBS / ((drainedAt - startedAt) / 1_000)),
      };
      console.log(`soak summary\n${JSON.stringify(summary, null, 2)}`);

      expect(restart, 'the database restart happened').not.toBeNull();
      expect(kills.length).toBeGreaterThanOrEqual(3);
      expect(report.notDone).toEqual([]);
      expect(report.done).toBe(JOBS);
      expect(duplicates!.n).toBe(0);
      expect(lost).toBe(0);
      expect(report.effects).toBe(JOBS);
      expect(await store!.stats(queue)).toMatchObject({ ready: 0, leased: 0, delayed: 0, dead: 0 });
      // A dead worker's lease runs out within LEASE_MS of its last renewal; the reaper then takes
      // at most one interval (slack for a loaded machine). A lease that runs out while the
      // database is down waits for it, and for the reaper to reconnect, on top.
      expect(maxLeasedAfterDeathAwayFromRestartMs).toBeLessThan(LEASE_MS + REAPER_MS + 1_500);
      expect(maxLeasedAfterDeathMs).toBeLessThan(LEASE_MS + REAPER_MS + OUTAGE_MS + 5_000);
    },
  );
});
