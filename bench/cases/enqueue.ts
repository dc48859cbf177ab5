import {
  bounded,
  dropSchema,
  openStore,
  payload,
  perSecond,
  producerFor,
  runConcurrently,
  schemaName,
  type Result,
  type Target,
} from '../common.js';
import { RawReference } from '../reference.js';

/**
 * Enqueue throughput: sequential, 16 concurrent producers (each with and without batching of
 * single enqueues), bulk batches of 1,000. On PostgreSQL each figure has a raw `pg` reference;
 * on SQL Server only ours is measured.
 */
export async function enqueueCase(target: Target, scale: number): Promise<Result[]> {
  const schema = schemaName('enqueue');
  const store = await openStore(target, schema, 20);
  const raw = target.dialect === 'postgres' ? await RawReference.open(target.url, schema, 20) : null;
  const producer = producerFor(store);
  const label = target.dialect === 'postgres' ? '' : ' [SQL Server]';
  const results: Result[] = [];
  try {
    await bounded(
      'enqueue case',
      300_000,
      (async () => {
        // Queue names sort as the reference's do ('raw' < 'raw-bulk'): each bulk batch then lands
        // at the right end of the claim index on both sides. Before, ours went into the middle
        // ('bulk' < 'conc'), which alone cost it about 30% of the bulk figure.

        // The library's default (single enqueues batched) and the same producer without batching:
        // a lone call must not pay for the batching, and concurrent ones should gain from it.
        // Batching off goes first: right after the batched variant's fast inserts (autovacuum of
        // the jobs table, likely), the unbatched 16 producers measured 74% of the raw inserts
        // instead of 81%.
        const unbatched = producerFor(store, undefined, { batching: false });
        for (const variant of [
          { producer: unbatched, label: ', batching off' },
          { producer, label: '' },
        ]) {
          const seq = await alternate(
            raw && ((n) => raw.singleInserts(n, 1)),
            async (n) => {
              const started = performance.now();
              for (let i = 0; i < n; i++) await variant.producer.enqueue('single', payload(i));
              return perSecond(n, performance.now() - started);
            },
            Math.round(2_000 * scale),
          );
          results.push({
            case: 'enqueue',
            variant: `sequential (1 producer)${variant.label}${label}`,
            value: seq.ours,
            unit: 'jobs/s',
            ...(seq.reference ? { reference: { name: 'raw single INSERT, 1 client', value: seq.reference } } : {}),
          });
        }

        // Without batching, the library's default (batched, NOTIFY wake-ups for other processes)
        // and, on PostgreSQL, without the wake-ups, to show what each one changes.
        const producers = [
          { producer: unbatched, label: ', batching off' },
          { producer, label: '' },
          ...(store.notify
            ? [{ producer: producerFor(store, undefined, { remoteWakeups: false }), label: ', wake-ups off' }]
            : []),
        ];
        for (const variant of producers) {
          const concurrent = await alternate(
            raw && ((n) => raw.singleInserts(n, 16)),
            async (n) => {
              const started = performance.now();
              await runConcurrently(16, n, async (i) => void (await variant.producer.enqueue('single', payload(i))));
              return perSecond(n, performance.now() - started);
            },
            Math.round(16_000 * scale),
          );
          results.push({
            case: 'enqueue',
            variant: `16 concurrent producers${variant.label}${label}`,
            value: concurrent.ours,
            unit: 'jobs/s',
            ...(concurrent.reference
              ? { reference: { name: 'raw single INSERT, 16 clients', value: concurrent.reference } }
              : {}),
            ...(variant.label ? {} : { target: '>= 150% of reference' }),
          });
        }

        const bulk = await alternate(
          raw && ((n) => raw.bulkInserts(n, 1_000)),
          async (n) => {
            const started = performance.now();
            for (let done = 0; done < n; done += 1_000) {
              await producer.enqueueMany(
                'single-bulk',
                Array.from({ length: 1_000 }, (_, k) => ({ payload: payload(done + k) })),
              );
            }
            return perSecond(n, performance.now() - started);
          },
          Math.round(100_000 * scale),
        );
        results.push({
          case: 'enqueue',
          variant: `bulk, 1,000 per call${label}`,
          value: bulk.ours,
          unit: 'jobs/s',
          ...(bulk.reference ? { reference: { name: 'raw INSERT of 1,000 rows', value: bulk.reference } } : {}),
          target: '>= 90% of reference',
        });
      })(),
    );
  } finally {
    await raw?.close();
    await store.close();
    await dropSchema(target, schema);
  }
  return results;
}

/**
 * Runs the reference and ours in alternating quarters of `total` jobs and averages each side's
 * rate, so a slow moment of the machine (a checkpoint, autovacuum) does not land on one side only.
 */
async function alternate(
  reference: ((jobs: number) => Promise<number>) | null,
  ours: (jobs: number) => Promise<number>,
  total: number,
): Promise<{ ours: number; reference: number | null }> {
  const quarter = Math.max(1_000, Math.round(total / 4 / 1_000) * 1_000);
  const rates = { ours: [] as number[], reference: [] as number[] };
  for (let round = 0; round < 4; round++) {
    if (reference) rates.reference.push(await reference(quarter));
    rates.ours.push(await ours(quarter));
  }
  const mean = (values: number[]) => Math.round(values.reduce((a, b) => a + b, 0) / values.length);
  return { ours: mean(rates.ours), reference: reference ? mean(rates.reference) : null };
}
