import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { WakeBus } from '../../lib/src/core/wake.js';
import type { QueueOptions } from '../../lib/src/core/options.js';
import {
  bounded,
  consumerFor,
  dropSchema,
  openStore,
  percentile,
  producerFor,
  schemaName,
  type Result,
} from '../common.js';

const RATE_PER_SECOND = 200;

/** Wall-clock milliseconds with sub-millisecond precision, comparable across processes. */
export function wallNow(): number {
  return performance.timeOrigin + performance.now();
}

/** Enqueues at a steady rate, each job carrying its send time; returns when all are sent. */
async function paced(seconds: number, send: (sentAt: number, i: number) => Promise<unknown>): Promise<number> {
  const total = RATE_PER_SECOND * seconds;
  const interval = 1000 / RATE_PER_SECOND;
  const start = performance.now();
  const pending: Promise<unknown>[] = [];
  for (let i = 0; i < total; i++) {
    const due = start + i * interval;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((resolve) => setTimeout(resolve, wait));
    pending.push(send(wallNow(), i));
  }
  await Promise.all(pending);
  return total;
}

function summary(latencies: number[]): { p50: number; p95: number; p99: number; max: number } {
  const sorted = [...latencies].sort((a, b) => a - b);
  const round = (n: number) => Math.round(n * 100) / 100;
  return {
    p50: round(percentile(sorted, 50)),
    p95: round(percentile(sorted, 95)),
    p99: round(percentile(sorted, 99)),
    max: round(sorted.at(-1) ?? Number.NaN),
  };
}

function asResults(variant: string, s: ReturnType<typeof summary>): Result[] {
  return [
    { case: 'latency', variant: `${variant} p50`, value: s.p50, unit: 'ms', target: '<= 3 ms', pass: s.p50 <= 3 },
    { case: 'latency', variant: `${variant} p95`, value: s.p95, unit: 'ms' },
    { case: 'latency', variant: `${variant} p99`, value: s.p99, unit: 'ms', target: '<= 20 ms', pass: s.p99 <= 20 },
    { case: 'latency', variant: `${variant} max`, value: s.max, unit: 'ms' },
  ];
}

/** The README's quick start (`maxReaders` only), and the profile tuned for latency. */
const PROFILES: { name: string; options: QueueOptions }[] = [
  { name: 'README defaults', options: { maxReaders: 10 } },
  { name: 'tuned', options: { minReaders: 2, maxReaders: 4 } },
];

/** 200 jobs/s for `seconds` into idle consumers: enqueue call → handler start. */
export async function latencyCase(url: string, seconds: number): Promise<Result[]> {
  const results: Result[] = [];
  for (const profile of PROFILES) {
    results.push(...(await inProcess(url, seconds, profile)));
    results.push(...(await crossProcess(url, seconds, profile)));
  }
  return results;
}

async function inProcess(url: string, seconds: number, profile: (typeof PROFILES)[number]): Promise<Result[]> {
  const schema = schemaName('latency');
  const store = await openStore(url, schema, 10);
  const wakeBus = new WakeBus();
  // The module's producer (batching on); the consumer is in this process, so no NOTIFY.
  const producer = producerFor(store, wakeBus, { remoteWakeups: false });
  const latencies: number[] = [];
  const consumer = consumerFor(
    store,
    [
      {
        queue: 'latency',
        options: profile.options,
        handler: async (p) => void latencies.push(wallNow() - (p as { sentAt: number }).sentAt),
      },
    ],
    [],
    wakeBus,
  );
  try {
    await consumer.start();
    // Let the readers go idle (empty claims, backing off) before the steady load starts.
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    const total = await bounded(
      'in-process latency',
      (seconds + 30) * 1000,
      paced(seconds, (sentAt) => producer.enqueue('latency', { sentAt })),
    );
    await bounded(
      'in-process latency drain',
      30_000,
      waitUntil(() => latencies.length >= total),
    );
    return asResults(`in-process (local wake-up), ${profile.name}`, summary(latencies));
  } finally {
    await consumer.stop(5_000);
    await store.close();
    await dropSchema(url, schema);
  }
}

async function waitUntil(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 10));
}

async function crossProcess(url: string, seconds: number, profile: (typeof PROFILES)[number]): Promise<Result[]> {
  const schema = schemaName('xlatency');
  const store = await openStore(url, schema, 10);
  const producer = producerFor(store);
  const script = fileURLToPath(new URL('../latency-consumer.js', import.meta.url));
  const child = fork(script, [JSON.stringify({ url, schema, queue: 'latency', options: profile.options })], {
    stdio: 'inherit',
  });
  const latencies: number[] = [];
  let ready!: () => void;
  const isReady = new Promise<void>((resolve) => (ready = resolve));
  child.on('message', (message: { type: string; latency?: number }) => {
    if (message.type === 'ready') ready();
    if (message.type === 'started') latencies.push(message.latency!);
  });
  try {
    await bounded('latency consumer start', 30_000, isReady);
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    const total = await bounded(
      'cross-process latency',
      (seconds + 30) * 1000,
      paced(seconds, (sentAt) => producer.enqueue('latency', { sentAt })),
    );
    await bounded(
      'cross-process latency drain',
      30_000,
      waitUntil(() => latencies.length >= total),
    );
    return asResults(`other process (LISTEN/NOTIFY), ${profile.name}`, summary(latencies));
  } finally {
    child.kill('SIGTERM');
    await new Promise((resolve) => child.once('exit', resolve));
    await store.close();
    await dropSchema(url, schema);
  }
}
