import pg from 'pg';
import { afterAll, afterEach, expect, it } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';
import { waitFor } from '../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../helpers/worker-process.js';

const schema = uniqueSchema('twoapps');
afterEach(() => killAllWorkers());
afterAll(() => dropPgSchema(schema));

it('two Nest applications in separate processes share one queue without running a job twice', async () => {
  const store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
  await store.migrate('auto');
  await createEffectTables(PG_URL, schema);
  const queue = 'shared';
  const total = 600;
  const config = { url: PG_URL, schema, queue, handlerDelayMs: 2, minReaders: 2, maxReaders: 4 };
  const workers = await Promise.all([WorkerProcess.start(config), WorkerProcess.start(config)]);
  await store.enqueue(
    Array.from({ length: total }, (_, n) =>
      prepareJob(queue, { n }, { idempotencyKey: `order-${n}` }, { maxPayloadBytes: 1024, defaultMaxAttempts: 5 }),
    ),
  );
  await waitFor(
    () => store.stats(queue),
    (s) => s.ready === 0 && s.leased === 0 && s.delayed === 0,
    {
      timeoutMs: 60_000,
      what: 'both workers to drain the queue',
    },
  );
  await Promise.all(workers.map((w) => w.stop()));
  await store.close();

  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  try {
    const runs = await client.query(
      `SELECT count(*)::int AS runs, count(DISTINCT job_id)::int AS jobs FROM "${schema}".runs`,
    );
    expect(runs.rows[0]).toEqual({ runs: total, jobs: total });
    const perWorker = await client.query(`SELECT pid, count(*)::int AS n FROM "${schema}".runs GROUP BY pid`);
    expect(perWorker.rows).toHaveLength(2);
    for (const row of perWorker.rows) expect(row.n).toBeGreaterThan(total / 10);
    const effects = await client.query(`SELECT count(*)::int AS n FROM "${schema}".effects`);
    expect(effects.rows[0].n).toBe(total);
    const done = await client.query(`SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state = 'done'`);
    expect(done.rows[0].n).toBe(total);
  } finally {
    await client.end();
  }
});
