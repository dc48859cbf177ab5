import type { QueueOptions } from '../../lib/src/core/options.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import {
  bounded,
  consumerFor,
  dropSchema,
  openStore,
  payload,
  percentile,
  perSecond,
  producerFor,
  runConcurrently,
  schemaName,
  sql,
  type Result,
} from '../common.js';

/** The README's quick start at concurrency 10, as the drain case's README-defaults profile. */
const DEFAULTS: QueueOptions = { maxReaders: 10 };

/** Claims before the timed ones: the first prepares the statement and warms the pool. */
const WARMUP_CLAIMS = 20;

export interface GroupsCaseSizes {
  /** Jobs drained from every backlog. */
  drainTotal: number;
  /** Distinct groups in the big backlog (1,000,000 in the full run). */
  bigGroups: number;
  /** Timed claims per backlog. */
  samples: number;
  /** A drain stops here and reports the rate so far, so a slow one cannot stall the bench. */
  drainCapMs: number;
}

interface Backlog {
  queue: string;
  /** Distinct group keys in the backlog; null for ungrouped jobs. */
  groups: number | null;
  jobs: number;
  options: QueueOptions;
  /** Jobs the case takes from it; a backlog of exactly that many must be empty at the end. */
  taken: number;
}

interface Drained {
  rate: number;
  /** Less than asked when the drain hit its time cap. */
  drained: number;
}

let caseStarted = performance.now();

/** Progress on stderr, as run.ts reports cases: the big backlog takes a while to build. */
function progress(what: string): void {
  process.stderr.write(`  groups: ${what} (${Math.round((performance.now() - caseStarted) / 1000)} s)\n`);
}

/**
 * Ordered groups (issue 11): claim latency and drain rate with 10, 10,000 and `bigGroups`
 * distinct groups in the backlog, and the grouped drain at concurrency 10 against the same drain
 * of ungrouped jobs, all measured in this run. Each backlog is its own queue; the big one is built
 * last, so its bulk insert and vacuum do not run under the smaller measurements, and only
 * `drainTotal` of its jobs are drained.
 */
export async function groupsCase(url: string, sizes: GroupsCaseSizes): Promise<Result[]> {
  const { drainTotal, bigGroups, samples, drainCapMs } = sizes;
  caseStarted = performance.now();
  const schema = schemaName('groups');
  const store = await openStore(url, schema, 20);
  const producer = producerFor(store);
  // Every backlog holds what its timed claims, their warm-up and its drain take (the batched one
  // is only drained).
  const needed = drainTotal + samples + WARMUP_CLAIMS;
  const backlog = (queue: string, groups: number | null, options = DEFAULTS, taken = needed): Backlog => ({
    queue,
    groups,
    jobs: Math.max(taken, groups ?? 0),
    options,
    taken,
  });
  const ungrouped = backlog('groups-none', null);
  const ten = backlog('groups-10', 10);
  const tenThousand = backlog('groups-10k', 10_000);
  const batched = backlog('groups-10-batch', 10, { ...DEFAULTS, groupBatchSize: 100 }, drainTotal);
  const big = backlog('groups-big', bigGroups);
  try {
    return await bounded(
      'groups case',
      300_000,
      (async () => {
        // The same enqueueMany calls on both sides (1,000 jobs each), so the cost of groups shows.
        const enqueueNone = await enqueueBacklog(producer, ungrouped, 1_000, 1);
        const enqueueGrouped = await enqueueBacklog(producer, tenThousand, 1_000, 1);
        await enqueueBacklog(producer, ten, 1_000, 1);
        await enqueueBacklog(producer, batched, 1_000, 1);
        await vacuum(url, schema);

        const latency = new Map<string, { p50: number; p95: number }>();
        const drain = new Map<string, Drained>();
        for (const b of [ungrouped, ten, tenThousand]) {
          latency.set(b.queue, await claimLatency(store, b.queue, samples));
          drain.set(b.queue, await drainSome(store, b, drainTotal, drainCapMs));
        }
        drain.set(batched.queue, await drainSome(store, batched, drainTotal, drainCapMs));

        // 10,000 jobs per call (one statement, the producer's chunk), 4 calls at a time.
        const enqueueBig = await enqueueBacklog(producer, big, 10_000, 4);
        await vacuum(url, schema);
        latency.set(big.queue, await claimLatency(store, big.queue, samples));
        drain.set(big.queue, await drainSome(store, big, drainTotal, drainCapMs));

        // A backlog drained to the end must be empty: nothing stranded in a held or stale group.
        for (const b of [ungrouped, ten, tenThousand, batched]) {
          if (b.jobs !== b.taken || drain.get(b.queue)!.drained !== drainTotal) continue;
          const stats = await store.stats(b.queue);
          const left = stats.ready + stats.delayed + stats.leased + stats.dead;
          if (left !== 0) throw new Error(`groups case left ${left} jobs unfinished in ${b.queue}`);
        }

        const results: Result[] = [
          {
            case: 'groups',
            variant: 'enqueueMany, 10,000 groups (1,000 per call)',
            value: enqueueGrouped,
            unit: 'jobs/s',
            reference: { name: 'same calls, ungrouped', value: enqueueNone },
          },
          {
            case: 'groups',
            variant: `enqueueMany, ${big.groups!.toLocaleString('en')} groups (10,000 per call, 4 at a time)`,
            value: enqueueBig,
            unit: 'jobs/s',
          },
        ];
        // Flat: within 2x of the 10-group figure (issue 11). The p95 of a few hundred claims is
        // noisy, so only the p50 carries a verdict.
        const base = latency.get(ten.queue)!;
        for (const b of [ungrouped, ten, tenThousand, big]) {
          const { p50, p95 } = latency.get(b.queue)!;
          const compared = b.groups !== null && b.groups > 10;
          for (const [name, value, reference] of [
            ['p50', p50, base.p50],
            ['p95', p95, base.p95],
          ] as const) {
            results.push({
              case: 'groups',
              variant: `claim of 1, ${describe(b)} ${name}`,
              value,
              unit: 'ms',
              ...(compared ? { reference: { name: '10 groups', value: reference } } : {}),
              ...(compared && name === 'p50' ? { target: '<= 2x reference', pass: value <= 2 * reference } : {}),
            });
          }
        }
        const none = drain.get(ungrouped.queue)!;
        results.push({
          case: 'groups',
          variant: `drain, ${describe(ungrouped)}${capped(none, drainTotal)} (concurrency 10, README defaults)`,
          value: none.rate,
          unit: 'jobs/s',
        });
        for (const b of [ten, tenThousand, batched, big]) {
          const d = drain.get(b.queue)!;
          results.push({
            case: 'groups',
            variant: `drain, ${describe(b)}${capped(d, drainTotal)} (concurrency 10)`,
            value: d.rate,
            unit: 'jobs/s',
            reference: { name: 'ungrouped drain, same jobs', value: none.rate },
            target: '>= 50% of reference',
          });
        }
        results.push({
          case: 'groups',
          variant: `drain, ${describe(big)} vs 10 groups (concurrency 10)`,
          value: drain.get(big.queue)!.rate,
          unit: 'jobs/s',
          reference: { name: '10 groups', value: drain.get(ten.queue)!.rate },
          target: '>= 50% of reference',
        });
        return results;
      })(),
    );
  } finally {
    await store.close();
    await dropSchema(url, schema);
  }
}

function describe({ groups, options }: Backlog): string {
  if (groups === null) return 'ungrouped';
  const batch = options.groupBatchSize ? `, groupBatchSize ${options.groupBatchSize}` : '';
  return `${groups.toLocaleString('en')} groups${batch}`;
}

function capped({ drained }: Drained, total: number): string {
  return drained < total ? ` [cap: ${drained.toLocaleString('en')} of ${total.toLocaleString('en')}]` : '';
}

/**
 * Enqueues the backlog with enqueueMany, `perCall` jobs a call and `parallel` calls at a time.
 * Job i goes to group i mod groups: a group's jobs are spread over the backlog, in rising ids.
 * Returns jobs/s.
 */
async function enqueueBacklog(
  producer: ReturnType<typeof producerFor>,
  { queue, groups, jobs }: Backlog,
  perCall: number,
  parallel: number,
): Promise<number> {
  const started = performance.now();
  await runConcurrently(parallel, Math.ceil(jobs / perCall), async (call) => {
    const first = call * perCall;
    await producer.enqueueMany(
      queue,
      Array.from({ length: Math.min(perCall, jobs - first) }, (_, k) => {
        const i = first + k;
        if (groups === null) return { payload: payload(i) };
        const groupKey = `order-${i % groups}`;
        return { payload: { ...payload(i), groupKey }, groupKey };
      }),
    );
  });
  const rate = perSecond(jobs, performance.now() - started);
  progress(`enqueued ${jobs.toLocaleString('en')} jobs into ${queue}, ${rate.toLocaleString('en')} jobs/s`);
  return rate;
}

/** What autovacuum would do after a bulk insert, done now so it does not run under a measurement. */
async function vacuum(url: string, schema: string): Promise<void> {
  await sql(url, `VACUUM (ANALYZE) "${schema}".jobs, "${schema}".groups`);
}

/**
 * One claim of one unit, timed alone, `samples` times; each claimed job is completed (untimed)
 * before the next claim, so the backlog keeps its shape.
 */
async function claimLatency(store: QueueStore, queue: string, samples: number): Promise<{ p50: number; p95: number }> {
  const timings: number[] = [];
  for (let i = 0; i < WARMUP_CLAIMS + samples; i++) {
    const started = performance.now();
    const jobs = await store.claim({ queue, limit: 1, groupBatchSize: 1, leaseMs: 30_000, workerId: 'bench:claim' });
    const elapsed = performance.now() - started;
    if (jobs.length !== 1) throw new Error(`claim of 1 from ${queue} returned ${jobs.length} jobs`);
    if (i >= WARMUP_CLAIMS) timings.push(elapsed);
    await store.complete(jobs.map((job) => ({ id: job.id, claimToken: job.claimToken })));
  }
  timings.sort((a, b) => a - b);
  const round = (n: number) => Math.round(n * 100) / 100;
  const result = { p50: round(percentile(timings, 50)), p95: round(percentile(timings, 95)) };
  progress(`claims of 1 from ${queue}: p50 ${result.p50} ms, p95 ${result.p95} ms`);
  return result;
}

/**
 * The engine drains `total` jobs of the backlog with a no-op handler, or what it can in `capMs`;
 * jobs/s from consumer start to the last completion counted. The handler checks that each
 * group's jobs arrive in enqueue order, so a fast but wrong claim cannot pass for a fast one.
 */
async function drainSome(
  store: QueueStore,
  { queue, options }: Backlog,
  total: number,
  capMs: number,
): Promise<Drained> {
  let completed = 0;
  let finish!: () => void;
  const enough = new Promise<void>((resolve) => (finish = resolve));
  const lastSeen = new Map<string, number>();
  const disorder: string[] = [];
  // What the engine did, for the progress line: claims, their sizes and time, readers at most.
  let claims = 0;
  let claimedJobs = 0;
  let claimMs = 0;
  let emptyClaims = 0;
  let readers = 0;
  const consumer = consumerFor(
    store,
    [
      {
        queue,
        options,
        handler: async (p) => {
          const { orderId, groupKey } = p as { orderId: number; groupKey?: string };
          if (groupKey === undefined) return;
          const last = lastSeen.get(groupKey) ?? -1;
          if (last > orderId) disorder.push(`${groupKey}: ${orderId} after ${last}`);
          lastSeen.set(groupKey, orderId);
        },
      },
    ],
    [
      {
        completed: () => ++completed === total && finish(),
        claimed: ({ count, durationMs }) => {
          claims++;
          claimedJobs += count;
          claimMs += durationMs;
        },
        emptyClaim: () => void emptyClaims++,
        readersChanged: ({ readers: now }) => void (readers = Math.max(readers, now)),
      },
    ],
  );
  const started = performance.now();
  let counted: number;
  let elapsed: number;
  const ticker = setInterval(() => progress(`${queue}: ${completed} of ${total} drained`), 10_000);
  let cap: NodeJS.Timeout | undefined;
  await consumer.start();
  try {
    await new Promise<void>((resolve) => {
      cap = setTimeout(resolve, capMs);
      void enough.then(resolve);
    });
    counted = Math.min(completed, total);
    elapsed = performance.now() - started;
  } finally {
    clearTimeout(cap);
    clearInterval(ticker);
    await consumer.stop(5_000);
  }
  if (disorder.length > 0) {
    throw new Error(`${queue}: jobs of a group ran out of order (${disorder.slice(0, 3).join('; ')})`);
  }
  const rate = perSecond(counted, elapsed);
  progress(
    `drained ${counted.toLocaleString('en')} jobs of ${queue}, ${rate.toLocaleString('en')} jobs/s ` +
      `(${claims} claims of ${(claimedJobs / Math.max(1, claims)).toFixed(1)} jobs, ` +
      `${(claimMs / Math.max(1, claims)).toFixed(2)} ms each; ${emptyClaims} empty claims; at most ${readers} readers)`,
  );
  return { rate, drained: counted };
}
