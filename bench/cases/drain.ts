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
  type Result,
  type Target,
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

export async function drainCase(target: Target, scale: number): Promise<Result[]> {
  const schema = schemaName('drain');
  const store = await openStore(target, schema, 20);
  const raw = target.dialect === 'postgres' ? await RawReference.open(target.url, schema, 4) : null;
  const label = target.dialect === 'postgres' ? '' : ' [SQL Server]';
  const results: Result[] = [];
  const queues: string[] = [];
  try {
    const total = Math.round(20_000 * scale);
    const raw100 = await raw?.drain(total, 100);
    const raw1 = await raw?.drain(Math.round(total / 4), 1);
    for (const concurrency of [1, 10, 50]) {
      queues.push(`drain-${concurrency}`);
      const value = await drainOnce(store, `drain-${concurrency}`, total, concurrency, 'throughput');
      results.push({
        case: 'drain',
        variant: `concurrency ${concurrency} (batch 100, prefetch 200)${label}`,
        value,
        unit: 'jobs/s',
        ...(raw100 ? { reference: { name: 'raw claim LIMIT 100 + one completion', value: raw100 } } : {}),
        ...(concurrency === 10 ? { target: '>= 50% of reference' } : {}),
      });
    }
    for (const concurrency of [1, 10]) {
      queues.push(`drain-default-${concurrency}`);
      const value = await drainOnce(
        store,
        `drain-default-${concurrency}`,
        Math.round(total / 4),
        concurrency,
        'defaults',
      );
      results.push({
        case: 'drain',
        variant: `concurrency ${concurrency} (library defaults, no prefetch)${label}`,
        value,
        unit: 'jobs/s',
        ...(raw1 ? { reference: { name: 'raw claim LIMIT 1 + completion', value: raw1 } } : {}),
      });
    }
    for (const queue of queues) {
      const stats = await store.stats(queue);
      const left = stats.ready + stats.delayed + stats.leased + stats.dead;
      if (left !== 0) throw new Error(`drain left ${left} jobs unfinished in ${queue}`);
    }
  } finally {
    await raw?.close();
    await store.close();
    await dropSchema(target, schema);
  }
  return results;
}
