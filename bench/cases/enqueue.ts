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
 * Enqueue throughput: sequential, 16 concurrent producers, bulk batches of 1,000. On
 * PostgreSQL each figure has a raw `pg` reference; on SQL Server only ours is measured.
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
        const sequential = Math.round(2_000 * scale);
        const rawSequential = await raw?.singleInserts(sequential, 1);
        let started = performance.now();
        for (let i = 0; i < sequential; i++) await producer.enqueue('seq', payload(i));
        results.push({
          case: 'enqueue',
          variant: `sequential (1 producer)${label}`,
          value: perSecond(sequential, performance.now() - started),
          unit: 'jobs/s',
          ...(rawSequential ? { reference: { name: 'raw single INSERT, 1 client', value: rawSequential } } : {}),
        });

        const half = Math.round(8_000 * scale);
        // Alternate runs so a slow moment of the machine does not land on one side only.
        const rawA = await raw?.singleInserts(half, 16);
        started = performance.now();
        await runConcurrently(16, half, async (i) => void (await producer.enqueue('conc', payload(i))));
        const oursA = perSecond(half, performance.now() - started);
        const rawB = await raw?.singleInserts(half, 16);
        started = performance.now();
        await runConcurrently(16, half, async (i) => void (await producer.enqueue('conc', payload(i))));
        const oursB = perSecond(half, performance.now() - started);
        results.push({
          case: 'enqueue',
          variant: `16 concurrent producers${label}`,
          value: Math.round((oursA + oursB) / 2),
          unit: 'jobs/s',
          ...(rawA && rawB
            ? { reference: { name: 'raw single INSERT, 16 clients', value: Math.round((rawA + rawB) / 2) } }
            : {}),
          target: '>= 90% of reference',
        });

        const bulk = Math.round(100_000 * scale);
        const rawBulk = await raw?.bulkInserts(bulk, 1_000);
        started = performance.now();
        for (let done = 0; done < bulk; done += 1_000) {
          await producer.enqueueMany(
            'bulk',
            Array.from({ length: 1_000 }, (_, k) => ({ payload: payload(done + k) })),
          );
        }
        results.push({
          case: 'enqueue',
          variant: `bulk, 1,000 per call${label}`,
          value: perSecond(bulk, performance.now() - started),
          unit: 'jobs/s',
          ...(rawBulk ? { reference: { name: 'raw INSERT of 1,000 rows', value: rawBulk } } : {}),
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
