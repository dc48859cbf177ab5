import type pg from 'pg';
import pgLib from 'pg';
import { dropSchema, openStore, PG_URL, schemaName, sql, type Result } from '../common.js';
import { drainOnce, meanDrainCost } from './drain.js';

/**
 * Transactional handlers' cost (issue 25): the README's `{ maxReaders: 10 }` drain with a handler
 * that writes one row per job, transactional (the row and the completion in one transaction,
 * committed per job: a transactional completion cannot share a batch) against the same handler
 * writing in autocommit on a pool of its own and completing as always (completions batched),
 * alternated twice so drift hits both alike.
 */
export async function transactionalCase(scale: number): Promise<Result[]> {
  const schema = schemaName('txdrain');
  const store = await openStore(PG_URL, schema, 20);
  const writes = new pgLib.Pool({ connectionString: PG_URL, max: 10 });
  try {
    await sql(
      PG_URL,
      `CREATE TABLE "${schema}".effects (job_id bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
    );
    const insert = `INSERT INTO "${schema}".effects (job_id) VALUES ($1)`;
    const total = Math.round(10_000 * scale);
    const outside: number[] = [];
    const inside: number[] = [];
    for (let round = 0; round < 2; round++) {
      outside.push(
        await drainOnce(store, `tx-outside-${round}`, total, 10, 'defaults', {
          handler: async (_payload, context) => void (await writes.query(insert, [context.jobId])),
        }),
      );
      inside.push(
        await drainOnce(store, `tx-inside-${round}`, total, 10, 'defaults', {
          options: { transactional: true },
          handler: async (_payload, context) =>
            void (await (context.transaction as pg.ClientBase).query(insert, [context.jobId])),
        }),
      );
    }
    const [rows] = (await sql(PG_URL, `SELECT count(*)::int AS n FROM "${schema}".effects`)).rows as { n: number }[];
    if (rows!.n !== 4 * total) throw new Error(`transactional drain wrote ${rows!.n} effect rows, not ${4 * total}`);
    const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
    return [
      {
        case: 'transactional',
        variant: 'concurrency 10, one row per job written in the handler transaction (README defaults)',
        value: mean(inside),
        unit: 'jobs/s',
        reference: { name: 'the same row written outside, completion batched, alternated', value: mean(outside) },
        dbCost: meanDrainCost(['tx-inside-0', 'tx-inside-1']),
      },
      {
        case: 'transactional',
        variant: 'the same row written outside the handler transaction, completion batched (README defaults)',
        value: mean(outside),
        unit: 'jobs/s',
        dbCost: meanDrainCost(['tx-outside-0', 'tx-outside-1']),
      },
    ];
  } finally {
    await writes.end();
    await store.close();
    await dropSchema(PG_URL, schema);
  }
}
