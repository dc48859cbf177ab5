/**
 * Failure drill 5 (seed 000, issue 4): the database restarts while workers are busy. It runs
 * on a PostgreSQL server this file starts for itself (initdb into a temporary directory, own
 * port, run as the postgres OS user) — never the shared server the other test files use.
 *
 * Each worker reaches the server through a proxy of its own, which counts connection
 * attempts: during the outage they must come at a bounded rate (backoff), not as a storm.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../../lib/src/store/postgres/postgres.store.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { effectsReport, enqueueKeys } from '../../helpers/drills.js';
import { sql } from '../../helpers/databases.js';
import { PgProxy } from '../../helpers/pg-proxy.js';
import { PrivatePostgres } from '../../helpers/private-postgres.js';
import { waitFor } from '../../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';

const schema = uniqueSchema('restart');
let server: PrivatePostgres | null = null;
let store: PostgresQueueStore | null = null;
const proxies: PgProxy[] = [];

beforeAll(async () => {
  server = await PrivatePostgres.start();
  store = createPostgresStore({ url: server.url, poolSize: 2 }, { schema });
  await store.migrate('auto');
  await createEffectTables(server.url, schema);
});

afterAll(async () => {
  // Workers first (they would only reconnect), then the server, even when the drill failed.
  await killAllWorkers();
  await Promise.all(proxies.splice(0).map((proxy) => proxy.close()));
  await store?.close().catch(() => undefined);
  server?.destroy();
});

it('drill 5 — database restart mid-run: workers back off, log it clearly, reconnect and finish everything', async () => {
  const db = server!;
  const queue = 'restart';
  const total = 600;
  const outageMs = 2_000;
  const leaseMs = 3_000;
  const keys = Array.from({ length: total }, (_, n) => `restart-${n}`);
  await enqueueKeys(store!, queue, keys);
  for (let i = 0; i < 2; i++) proxies.push(await PgProxy.start(db.url));
  const workers = await Promise.all(
    proxies.map((proxy, i) =>
      WorkerProcess.start({
        url: proxy.urlFor(db.url),
        schema,
        queue,
        workerId: `drill5-${i + 1}`,
        leaseMs,
        minReaders: 2,
        maxReaders: 4,
        minPollMs: 20,
        maxPollMs: 200,
        reaperIntervalMs: 300,
        handlerDelayMs: 25,
      }),
    ),
  );

  // Restart while the workers are busy: a good part done, most still to do.
  const before = await waitFor(
    () => sql<{ n: number }>(db.url, `SELECT count(*)::int AS n FROM "${schema}".effects`),
    (rows) => rows[0]!.n >= 50,
    { timeoutMs: 30_000, what: 'the workers to get going' },
  );
  expect(before[0]!.n).toBeLessThan(total / 2);
  const downAt = Date.now();
  db.stopServer('immediate');
  // Keep it down until every worker has noticed and for the outage's full length: the fault
  // lasts that long, this is not a wait for a result.
  await waitFor(
    () => Date.now() - downAt >= outageMs && workers.every((w) => /claiming from queue 'restart' failed/.test(w.log)),
    Boolean,
    { timeoutMs: 30_000, intervalMs: 50, what: 'every worker to log that claiming failed' },
  );
  const upAt = Date.now();
  db.startServer();

  await waitFor(
    () => store!.stats(queue),
    (s) => s.ready === 0 && s.leased === 0 && s.delayed === 0,
    { timeoutMs: 60_000, intervalMs: 100, what: 'the workers to finish every job after the restart' },
  );
  const finishedAt = Date.now();

  // No job lost, none stuck leased or dead, every business effect exactly once.
  const stats = await store!.stats(queue);
  expect(stats).toMatchObject({ ready: 0, leased: 0, expiredLeases: 0, delayed: 0, dead: 0 });
  const report = await effectsReport(db.url, schema);
  expect(report.notDone).toEqual([]);
  expect(report.done).toBe(total);
  expect(report.effects).toBe(total);
  expect(report.missingEffects).toEqual([]);
  expect(report.duplicateEffects).toEqual([]);

  for (const [i, w] of workers.entries()) {
    // Still the same processes: the outage crashed nothing (an unhandled 'error' would have).
    expect(w.alive).toBe(true);
    // Logged clearly and once, not once per retry: the failure when it began, the recovery when it ended.
    await waitFor(
      () => w.log,
      (log) => /claiming from queue 'restart' recovered after \d+ s/.test(log),
      { what: `worker ${i + 1} to log its recovery` },
    );
    const claimLines = w.log.split('\n').filter((line) => line.includes("claiming from queue 'restart'"));
    expect(claimLines[0]).toMatch(/claiming from queue 'restart' failed: .+; retrying in \d+ ms/);
    expect(claimLines.at(-1)).toMatch(/recovered after \d+ s/);
    expect(claimLines.length, claimLines.join('\n')).toBeLessThanOrEqual(4);
    // Reconnects backed off: the claim loop, heartbeats, reaper, acker and wake-up listener
    // together opened at most a few connections per second while the server was down.
    const attempts = proxies[i]!.connectionsOpened.filter((t) => t >= downAt && t < upAt).length;
    const perSecond = attempts / ((upAt - downAt) / 1_000);
    expect(perSecond, `worker ${i + 1}: ${attempts} connection attempts in ${upAt - downAt} ms`).toBeLessThan(25);
  }
  console.log(
    `database restart: down ${upAt - downAt} ms; ${total} jobs done ${finishedAt - upAt} ms after restart; ${report.runs} handler runs, ${report.refusedRepeats} repeated effects refused; connection attempts during outage: ${proxies.map((p) => p.connectionsOpened.filter((t) => t >= downAt && t < upAt).length).join(', ')}`,
  );
});
