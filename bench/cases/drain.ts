import type { QueueOptions } from '../../lib/src/core/options.js';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
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
import { costPerJob, wireCounters, type DbCost } from '../db-cost.js';

/**
 * Two ways to run a queue at a handler concurrency of `concurrency`:
 * - 'defaults': what the README's quick start writes, `{ maxReaders: concurrency }` and nothing else;
 * - 'throughput': every reader started up front, claims of up to 100 and up to 200 jobs
 *   prefetched (leased ahead of the readers), the tuned profile for short jobs.
 */
export type DrainProfile = 'defaults' | 'throughput';

export function drainOptions(concurrency: number, profile: DrainProfile): QueueOptions {
  if (profile === 'defaults') return { maxReaders: concurrency };
  return { minReaders: concurrency, maxReaders: concurrency, batchSize: 100, prefetch: 200 };
}

/** What a drain varies beyond its profile. */
export interface DrainVariant {
  /** One context.progress() per job. */
  progress?: boolean;
  /** Queue options over the profile's (flow limits, …). */
  options?: QueueOptions;
  /** Job n's concurrency key (none: no key). */
  keyOf?: (n: number) => string;
  /** The handler, instead of a no-op (or the progress report). */
  handler?: (payload: unknown, context: JobContext) => Promise<void>;
}

/**
 * Drains `total` pre-enqueued jobs with a no-op handler (or one that reports progress once);
 * jobs/s from consumer start to last completion.
 */
export async function drainOnce(
  store: QueueStore,
  queue: string,
  total: number,
  concurrency: number,
  profile: DrainProfile = 'throughput',
  { progress = false, options = {}, keyOf, handler }: DrainVariant = {},
): Promise<number> {
  const producer = producerFor(store);
  for (let done = 0; done < total; done += 1_000) {
    await producer.enqueueMany(
      queue,
      Array.from({ length: Math.min(1_000, total - done) }, (_, k) => ({
        payload: payload(done + k),
        ...(keyOf ? { concurrencyKey: keyOf(done + k) } : {}),
      })),
    );
  }
  let completed = 0;
  let finish!: () => void;
  const allDone = new Promise<void>((resolve) => (finish = resolve));
  const consumer = consumerFor(
    store,
    [
      {
        queue,
        options: { ...drainOptions(concurrency, profile), ...options },
        handler: handler ?? (progress ? async (_payload, context) => context.progress(50) : async () => {}),
      },
    ],
    [{ completed: () => ++completed === total && finish() }],
  );
  const before = wireCounters();
  const started = performance.now();
  await consumer.start();
  await bounded(`draining ${total} jobs at concurrency ${concurrency}`, 300_000, allDone);
  const elapsed = performance.now() - started;
  await consumer.stop(5_000);
  drainCosts.set(queue, costPerJob(before, total));
  return perSecond(total, elapsed);
}

/** What each drainOnce cost the database per job (its drain, not the enqueue before it), by queue. */
export const drainCosts = new Map<string, DbCost>();

/** The mean cost of the drains of `queues`. */
export function meanDrainCost(queues: readonly string[]): DbCost | undefined {
  const costs = queues.map((queue) => drainCosts.get(queue)).filter((cost): cost is DbCost => cost !== undefined);
  if (costs.length === 0) return undefined;
  const mean = (pick: (cost: DbCost) => number) =>
    Math.round((costs.reduce((sum, cost) => sum + pick(cost), 0) / costs.length) * 1000) / 1000;
  return { statementsPerJob: mean((c) => c.statementsPerJob), commitsPerJob: mean((c) => c.commitsPerJob) };
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
    const tuned = new Map<number, number>();
    for (const concurrency of [1, 10, 50]) {
      queues.push(`drain-${concurrency}`);
      const value = await drainOnce(store, `drain-${concurrency}`, total, concurrency, 'throughput');
      tuned.set(concurrency, value);
      results.push({
        case: 'drain',
        variant: `concurrency ${concurrency} (tuned: batch 100, prefetch 200)${label}`,
        value,
        unit: 'jobs/s',
        ...(raw100 ? { reference: { name: 'raw claim LIMIT 100 + one completion', value: raw100 } } : {}),
        ...(concurrency === 10 ? { target: '>= 50% of reference' } : {}),
        ...(target.dialect === 'postgres' ? { dbCost: drainCosts.get(`drain-${concurrency}`) } : {}),
      });
    }
    // The README's quick start: `{ maxReaders }` only. Its yardstick is the tuned profile above.
    for (const concurrency of [1, 10, 50]) {
      queues.push(`drain-default-${concurrency}`);
      const value = await drainOnce(store, `drain-default-${concurrency}`, total, concurrency, 'defaults');
      results.push({
        case: 'drain',
        variant: `concurrency ${concurrency} (README defaults: only maxReaders)${label}`,
        value,
        unit: 'jobs/s',
        reference: { name: 'the tuned profile, same concurrency', value: tuned.get(concurrency)! },
        ...(concurrency === 1 ? {} : { target: '>= 80% of reference' }),
        ...(target.dialect === 'postgres' ? { dbCost: drainCosts.get(`drain-default-${concurrency}`) } : {}),
      });
    }
    // Job control's cost (issue 23): one progress report per job, README defaults at concurrency
    // 10, against the same without, alternated twice so drift hits both alike.
    const plain: number[] = [];
    const reporting: number[] = [];
    for (let round = 0; round < 2; round++) {
      for (const progress of [false, true]) {
        const queue = `drain-progress-${round}-${progress}`;
        queues.push(queue);
        (progress ? reporting : plain).push(await drainOnce(store, queue, total, 10, 'defaults', { progress }));
      }
    }
    const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
    results.push({
      case: 'drain',
      variant: `concurrency 10, one context.progress() per job (README defaults)${label}`,
      value: mean(reporting),
      unit: 'jobs/s',
      reference: { name: 'the same without progress, alternated', value: mean(plain) },
      target: '>= 90% of reference',
      ...(target.dialect === 'postgres'
        ? {
            dbCost: meanDrainCost(
              queues.filter((queue) => queue.startsWith('drain-progress-') && queue.endsWith('-true')),
            ),
          }
        : {}),
    });
    if (raw1) {
      results.push({
        case: 'drain',
        variant: `raw claim LIMIT 1 + completion, 1 connection${label}`,
        value: raw1,
        unit: 'jobs/s',
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
