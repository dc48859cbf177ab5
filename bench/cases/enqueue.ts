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
} from '../common.js';
import { RawReference } from '../reference.js';

/** Enqueue throughput: sequential, 16 concurrent producers, bulk batches of 1,000. */
export async function enqueueCase(url: string, scale: number): Promise<Result[]> {
  const schema = schemaName('enqueue');
  const store = await openStore(url, schema, 20);
  const raw = await RawReference.open(url, schema, 20);
  const producer = producerFor(store);
  const results: Result[] = [];
  try {
    await bounded(
      'enqueue case',
      300_000,
      (async () => {
        const sequential = Math.round(2_000 * scale);
        const rawSequential = await raw.singleInserts(sequential, 1);
        let started = performance.now();
        for (let i = 0; i < sequential; i++) await producer.enqueue('seq', payload(i));
        const oursSequential = perSecond(sequential, performance.now() - started);
        results.push({
          case: 'enqueue',
          variant: 'sequential (1 producer)',
          value: oursSequential,
          unit: 'jobs/s',
          reference: { name: 'raw single INSERT, 1 client', value: rawSequential },
        });

        const concurrent = Math.round(16_000 * scale);
        // Alternate runs so a slow moment of the machine does not land on one side only.
        const rawConcurrentA = await raw.singleInserts(concurrent / 2, 16);
        started = performance.now();
        await runConcurrently(16, concurrent / 2, async (i) => void (await producer.enqueue('conc', payload(i))));
        const oursA = perSecond(concurrent / 2, performance.now() - started);
        const rawConcurrentB = await raw.singleInserts(concurrent / 2, 16);
        started = performance.now();
        await runConcurrently(16, concurrent / 2, async (i) => void (await producer.enqueue('conc', payload(i))));
        const oursB = perSecond(concurrent / 2, performance.now() - started);
        results.push({
          case: 'enqueue',
          variant: '16 concurrent producers',
          value: Math.round((oursA + oursB) / 2),
          unit: 'jobs/s',
          reference: {
            name: 'raw single INSERT, 16 clients',
            value: Math.round((rawConcurrentA + rawConcurrentB) / 2),
          },
          target: '>= 90% of reference',
        });

        const bulk = Math.round(100_000 * scale);
        const rawBulk = await raw.bulkInserts(bulk, 1_000);
        started = performance.now();
        for (let done = 0; done < bulk; done += 1_000) {
          await producer.enqueueMany(
            'bulk',
            Array.from({ length: 1_000 }, (_, k) => ({ payload: payload(done + k) })),
          );
        }
        const oursBulk = perSecond(bulk, performance.now() - started);
        results.push({
          case: 'enqueue',
          variant: 'bulk, 1,000 per call',
          value: oursBulk,
          unit: 'jobs/s',
          reference: { name: 'raw INSERT of 1,000 rows', value: rawBulk },
          target: '>= 90% of reference',
        });
      })(),
    );
  } finally {
    await raw.close();
    await store.close();
    await dropSchema(url, schema);
  }
  return results;
}
