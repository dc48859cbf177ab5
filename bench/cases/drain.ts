import type { QueueOptions } from '../../lib/src/core/options.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import {
  bounded,
  consumerFor,
  dropSchema,
  openStore,
  payload,
  perSecond,
  producerFor,
  schemaName,
  sql,
  type Result,
} from '../common.js';
import { RawReference } from '../reference.js';

/**
 * Two ways to run a queue at a handler concurrency of `concurrency` (readers):
 * - 'defaults': the library's defaults (claims sized to the waiting readers, no prefetch);
 * - 'throughput': claims of up to 100 with up to 200 jobs prefetched (leased ahead of the
 *   readers), what bench/README.md recommends for short jobs.
 */
export type DrainProfile = 'defaults' | 'throughput';

export function drainOptions(concurrency: number, profile: DrainProfile): QueueOptions {
  const readers = { minReaders: concurrency, maxReaders: concurrency };
  return profile === 'defaults' ? readers : { ...readers, batchSize: 100, prefetch: 200 };
}

/** Drains `total` pre-enqueued jobs with a no-op handler; jobs/s from consumer start to last completion. */
export async function drainOnce(
  store: QueueStore,
  queue: string,
  total: number,
  concurrency: number,
  profile: DrainProfile = 'throughput',
): Promise<number> {
  const producer = producerFor(store);
  for (let done = 0; done < total; done += 1_000) {
    await producer.enqueueMany(
      queue,
      Array.from({ length: Math.min(1_000, total - done) }, (_, k) => ({ payload: payload(done + k) })),
    );
  }
  let completed = 0;
  let finish!: () => void;
  const allDone = new Promise<void>((resolve) => (finish = resolve));
  const consumer = consumerFor(
    store,
    [{ queue, options: drainOptions(concurrency, profile), handler: async () => {} }],
    [{ completed: () => ++completed === total && finish() }],
  );
  const started = performance.now();
  await consumer.start();
  await bounded(`draining ${total} jobs at concurrency ${concurrency}`, 300_000, allDone);
  const elapsed = performance.now() - started;
  await consumer.stop(5_000);
  return perSecond(total, elapsed);
}

export async function drainCase(url: string, scale: number): Promise<Result[]> {
  const schema = schemaName('drain');
  const store = await openStore(url, schema, 20);
  const raw = await RawReference.open(url, schema, 4);
  const results: Result[] = [];
  try {
    const total = Math.round(20_000 * scale);
    const raw100 = await raw.drain(total, 100);
    const raw1 = await raw.drain(Math.round(total / 4), 1);
    for (const concurrency of [1, 10, 50]) {
      const value = await drainOnce(store, `drain-${concurrency}`, total, concurrency, 'throughput');
      results.push({
        case: 'drain',
        variant: `concurrency ${concurrency} (batch 100, prefetch 200)`,
        value,
        unit: 'jobs/s',
        reference: { name: 'raw claim LIMIT 100 + one completion', value: raw100 },
        ...(concurrency === 10 ? { target: '>= 50% of reference' } : {}),
      });
    }
    for (const concurrency of [1, 10]) {
      const value = await drainOnce(
        store,
        `drain-default-${concurrency}`,
        Math.round(total / 4),
        concurrency,
        'defaults',
      );
      results.push({
        case: 'drain',
        variant: `concurrency ${concurrency} (library defaults, no prefetch)`,
        value,
        unit: 'jobs/s',
        reference: { name: 'raw claim LIMIT 1 + completion', value: raw1 },
      });
    }
    const [left] = (await sql(url, `SELECT count(*)::int AS n FROM "${schema}".jobs WHERE state <> 'done'`)).rows;
    if (left.n !== 0) throw new Error(`drain left ${left.n} jobs unfinished`);
  } finally {
    await raw.close();
    await store.close();
    await dropSchema(url, schema);
  }
  return results;
}
