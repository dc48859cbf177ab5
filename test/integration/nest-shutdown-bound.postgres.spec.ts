import pg from 'pg';
import { afterAll, it } from 'vitest';
import { SqlQueueModule } from '../../lib/src/index.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { createQueueApp } from '../helpers/queue-app.js';
import { waitFor } from '../helpers/wait-for.js';

// Regression, found in review. Before the fix, the reaper's bounded wait for a stuck run was
// defeated one hook later: the stuck run still held a pool client, and closing the pool waits for
// every checked-out client, so shutdown lasted until the statement failed by itself
// (queryTimeoutMs, 60 s by default).

const schema = uniqueSchema('rv_sdb');
const appName = `rv_sdb_${schema}`;
afterAll(() => dropPgSchema(schema));

it('closes within the documented bound while a reaper statement is stuck', { timeout: 60_000 }, async () => {
  const { app } = await createQueueApp({
    schema,
    queueModule: SqlQueueModule.forRoot({
      connection: {
        dialect: 'postgres',
        url: `${PG_URL}?application_name=${appName}`,
        poolSize: 2,
        queryTimeoutMs: 40_000,
      },
      schema,
      consumer: { enabled: false, shutdownTimeoutMs: 0 },
      reaper: { intervalMs: 50 },
      retention: { enabled: false },
    }),
  });

  // Another session holds the jobs table: the next reaper statement blocks (a database that
  // stopped answering looks the same to the pool).
  const locker = new pg.Client({ connectionString: PG_URL });
  await locker.connect();
  try {
    await locker.query('BEGIN');
    await locker.query(`LOCK TABLE "${schema}".jobs IN ACCESS EXCLUSIVE MODE`);
    await waitFor(
      async () =>
        (
          await sql<{ n: string }>(
            PG_URL,
            `SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
            [appName],
          )
        )[0]!.n,
      (n) => Number(n) > 0,
      { what: 'a reaper statement blocked on the lock' },
    );

    const startedAt = Date.now();
    let closedAfterMs: number | null = null;
    const closing = app.close().then(() => {
      closedAfterMs = Date.now() - startedAt;
    });
    // The reaper's run is waited for 10 s, then the pool's close 5 s; 3 s of slack.
    await waitFor(
      () => closedAfterMs,
      (ms) => ms !== null,
      { timeoutMs: 18_000, what: 'app.close() to finish within the documented bound' },
    ).finally(async () => {
      await locker.query('ROLLBACK').catch(() => undefined);
      await closing;
    });
  } finally {
    await locker.end();
  }
});
