import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { FlowLimits } from '../../lib/src/core/types.js';
import {
  dropSchema,
  openStore,
  payload,
  percentile,
  producerFor,
  schemaName,
  type Result,
  type Target,
} from '../common.js';
import { drainOnce } from './drain.js';

const NO_LIMITS: FlowLimits = {
  globalConcurrency: null,
  concurrencyPerKey: null,
  rateLimit: null,
  rateLimitPerKey: null,
};

/**
 * The README's `{ maxReaders: 10 }` drain of `total` jobs over `keys` concurrency keys (0: no key),
 * with `limits` recorded as a consumer's boot records them.
 */
async function drainKeyed(
  store: QueueStore,
  queue: string,
  total: number,
  keys: number,
  limits: Partial<FlowLimits>,
): Promise<number> {
  await store.recordQueueSettings([{ queue, maxAttempts: 25, limits: { ...NO_LIMITS, ...limits } }]);
  return drainOnce(store, queue, total, 10, 'defaults', {
    options: { concurrencyPerKey: limits.concurrencyPerKey ?? undefined },
    ...(keys > 0 ? { keyOf: (n: number) => `tenant-${n % keys}` } : {}),
  });
}

/**
 * Median time of one claim of 10 (and its completion, so the same keys stay claimable) on a
 * queue whose jobs are spread over `keys` keys at concurrencyPerKey 1.
 */
async function claimLatency(store: QueueStore, queue: string, keys: number, jobsPerKey: number): Promise<number> {
  await store.recordQueueSettings([{ queue, maxAttempts: 25, limits: { ...NO_LIMITS, concurrencyPerKey: 1 } }]);
  const producer = producerFor(store);
  const total = keys * jobsPerKey;
  for (let done = 0; done < total; done += 5_000) {
    await producer.enqueueMany(
      queue,
      Array.from({ length: Math.min(5_000, total - done) }, (_, k) => ({
        payload: payload(done + k),
        concurrencyKey: `tenant-${(done + k) % keys}`,
      })),
    );
  }
  const times: number[] = [];
  for (let round = 0; round < 200; round++) {
    const started = performance.now();
    const jobs = await store.claim({ queue, limit: 10, leaseMs: 60_000, workerId: 'bench', limited: true });
    times.push(performance.now() - started);
    await store.complete(jobs.map((job) => ({ id: job.id, claimToken: job.claimToken })));
  }
  return percentile(
    times.sort((a, b) => a - b),
    50,
  );
}

/**
 * Flow control's costs (issue 24): the drain of jobs over 10,000 keys at concurrencyPerKey 1
 * against the same drain without keys or limits (the README's `{ maxReaders: 10 }`), alternated
 * twice; and the claim's latency from 10 to 100,000 keys.
 */
export async function flowCase(target: Target, scale: number): Promise<Result[]> {
  const schema = schemaName('flow');
  const store = await openStore(target, schema, 20);
  const results: Result[] = [];
  try {
    const total = Math.round(20_000 * scale);
    const plain: number[] = [];
    const keyed: number[] = [];
    for (let round = 0; round < 2; round++) {
      plain.push(await drainKeyed(store, `flow-plain-${round}`, total, 0, {}));
      keyed.push(await drainKeyed(store, `flow-keyed-${round}`, total, 10_000, { concurrencyPerKey: 1 }));
    }
    const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
    results.push({
      case: 'flow',
      variant: 'drain, concurrency 10, 10,000 keys at concurrencyPerKey 1 (README defaults)',
      value: mean(keyed),
      unit: 'jobs/s',
      reference: { name: 'the same drain without keys or limits, alternated', value: mean(plain) },
      target: '>= 50% of reference',
    });
    const fewKeys = await claimLatency(store, 'flow-claim-10', 10, Math.round(2_000 * scale));
    for (const keys of [1_000, Math.round(100_000 * scale)]) {
      results.push({
        case: 'flow',
        variant: `claim of 10 at concurrencyPerKey 1, ${keys.toLocaleString('en-US')} keys (median)`,
        value: await claimLatency(store, `flow-claim-${keys}`, keys, 1 + Math.ceil(2_000 / keys)),
        unit: 'ms',
        reference: { name: 'the same claim with 10 keys', value: fewKeys },
        target: '<= 200% of reference',
      });
    }
  } finally {
    await store.close();
    await dropSchema(target, schema);
  }
  return results;
}
