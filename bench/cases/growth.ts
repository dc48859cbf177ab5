import { percentile, schemaName, dropSchema, openStore, sql, type Result } from '../common.js';
import { drainOnce } from './drain.js';

/**
 * Does history slow the hot path? Drain rate at concurrency 10 on an empty table, then again
 * with `finished` done jobs in the table; and the stats query time at that size.
 */
export async function growthCase(url: string, finished: number, drainTotal: number): Promise<Result[]> {
  const schema = schemaName('growth');
  const store = await openStore(url, schema, 20);
  try {
    const empty = await drainOnce(store, 'growth-empty', drainTotal, 10);
    // History as the queue leaves it: done rows with finish times, in another queue and this one.
    await sql(
      url,
      `INSERT INTO "${schema}".jobs (queue, state, payload, priority, run_at, attempts, max_attempts, claim_token, created_at, claimed_at, finished_at)
       SELECT CASE WHEN g % 2 = 0 THEN 'growth-full' ELSE 'history' END, 'done', jsonb_build_object('orderId', g), 0,
              now() - interval '1 day', 1, 25, gen_random_uuid(), now() - interval '1 day', now() - interval '1 day', now() - interval '1 day' + g * interval '1 millisecond'
       FROM generate_series(1, $1) g`,
      [finished],
    );
    await sql(url, `ANALYZE "${schema}".jobs`);
    const full = await drainOnce(store, 'growth-full', drainTotal, 10);
    const timings: number[] = [];
    for (let i = 0; i < 25; i++) {
      const started = performance.now();
      await store.stats('growth-full');
      timings.push(performance.now() - started);
    }
    timings.sort((a, b) => a - b);
    const label = `${(finished / 1_000_000).toLocaleString('en')}M finished rows`;
    return [
      { case: 'growth', variant: 'drain, empty table (concurrency 10)', value: empty, unit: 'jobs/s' },
      {
        case: 'growth',
        variant: `drain with ${label} (concurrency 10)`,
        value: full,
        unit: 'jobs/s',
        reference: { name: 'same drain on an empty table', value: empty },
        target: '>= 90% of reference',
      },
      {
        case: 'growth',
        variant: `stats() p50 with ${label}`,
        value: Math.round(percentile(timings, 50) * 100) / 100,
        unit: 'ms',
        target: '< 50 ms',
        pass: percentile(timings, 50) < 50,
      },
      {
        case: 'growth',
        variant: `stats() max with ${label}`,
        value: Math.round(timings.at(-1)! * 100) / 100,
        unit: 'ms',
      },
    ];
  } finally {
    await store.close();
    await dropSchema(url, schema);
  }
}
