import { Module } from '@nestjs/common';
import { Registry } from 'prom-client';
import { afterAll, expect, it } from 'vitest';
import { QueueHandler, SqlQueueModule } from '../../lib/src/index.js';
import { SqlQueuePrometheusModule } from '../../lib/src/prometheus.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { createQueueApp } from '../helpers/queue-app.js';
import { waitFor } from '../helpers/wait-for.js';

// Regression, found in review. Before the fix, SqlQueueModule's own boot errors (two handlers for
// a queue, a second forRoot(), a missing ScheduleModule) were thrown from onApplicationBootstrap.
// By then the runtime's pool was open, and the lease reaper (bootstrapped in the same Promise.all)
// had registered its interval, or the readers had started. A rejected createApplicationContext()
// never hands the context back, so nothing could close them, and a `main().catch(log)` process
// did not exit.

const schema = uniqueSchema('rv_bootfail');
const appName = `rv_bootfail_${schema}`;
afterAll(() => dropPgSchema(schema));

async function connections(): Promise<number> {
  const rows = await sql<{ n: string }>(
    PG_URL,
    'SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1',
    [appName],
  );
  return Number(rows[0]!.n);
}

it('releases its connections and stops its reaper when its own boot check fails', async () => {
  @QueueHandler('review.dup')
  class FirstHandler {
    async handle() {}
  }
  @QueueHandler('review.dup')
  class SecondHandler {
    async handle() {}
  }
  @Module({ providers: [FirstHandler, SecondHandler] })
  class Handlers {}

  await expect(
    createQueueApp({
      schema,
      queueModule: SqlQueueModule.forRoot({
        // application_name in the URL marks this app's connections in pg_stat_activity.
        connection: { dialect: 'postgres', url: `${PG_URL}?application_name=${appName}`, poolSize: 2 },
        schema,
        reaper: { intervalMs: 50 },
      }),
      imports: [Handlers],
    }),
  ).rejects.toThrow(/queue 'review.dup' has two handlers/);

  // Nothing of the failed application may stay connected (before the fix, the reaper kept
  // running every 50 ms on a pool nobody could close).
  await waitFor(connections, (n) => n === 0, { timeoutMs: 3_000, what: 'the failed app to release its connections' });
});

it('leaves a shared Prometheus registry usable after its own boot check fails', async () => {
  // The shape of prom-client's global `register` shared by the apps of one test process.
  const registry = new Registry();
  @QueueHandler('review.dup2')
  class FirstHandler {
    async handle() {}
  }
  @QueueHandler('review.dup2')
  class SecondHandler {
    async handle() {}
  }
  const queueModule = () =>
    SqlQueueModule.forRoot({
      connection: { dialect: 'postgres', url: PG_URL, poolSize: 2 },
      schema,
      reaper: { enabled: false },
      retention: { enabled: false },
    });
  await expect(
    createQueueApp({
      schema,
      queueModule: queueModule(),
      imports: [SqlQueuePrometheusModule.forRoot({ registry })],
      providers: [FirstHandler, SecondHandler],
    }),
  ).rejects.toThrow(/two handlers/);

  // The exporter registered its metrics in onModuleInit; the failed app never reaches
  // onApplicationShutdown, so they stay, and every later app on that registry is refused.
  const next = await createQueueApp({
    schema,
    queueModule: queueModule(),
    imports: [SqlQueuePrometheusModule.forRoot({ registry })],
  }).catch((error: Error) => error);
  if (!(next instanceof Error)) await next.app.close();
  expect(next instanceof Error ? next.message : 'booted').toBe('booted');
});

it('releases its connections when ScheduleModule is missing', async () => {
  @QueueHandler('review.nosched')
  class Handler {
    async handle() {}
  }
  await expect(
    createQueueApp({
      schema,
      withSchedule: false,
      queueModule: SqlQueueModule.forRoot({
        connection: { dialect: 'postgres', url: `${PG_URL}?application_name=${appName}`, poolSize: 2 },
        schema,
      }),
      providers: [Handler],
    }),
  ).rejects.toThrow(/ScheduleModule/);
  await waitFor(connections, (n) => n === 0, { timeoutMs: 3_000, what: 'the failed app to release its connections' });
});
