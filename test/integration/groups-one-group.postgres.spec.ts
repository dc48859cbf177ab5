import { describe, expect, it } from 'vitest';
import { systemClock } from '../../lib/src/core/clock.js';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import { silentLogger } from '../../lib/src/core/logger.js';
import { resolveConsumerOptions, resolveQueueOptions, type QueueOptions } from '../../lib/src/core/options.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import { enqueueIds, groupJob } from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * Ordered groups, proof 6 (issue 11) and seed 003: a thousand jobs in one group are work for one
 * reader. The engine runs in this process against PostgreSQL with maxReaders 8: never more than
 * one handler of the group at a time, in id order, and no reader is started for the backlog
 * behind the group's head (readersChanged). A control with several groups shows the readers do
 * grow when there is work for them, so the observation can fail.
 */
const db = migratedPgStore('grpone', 4);

interface Run {
  /** Job ids per group, in the order their handlers started. */
  order: Map<string, string[]>;
  /** Most handlers of one group running at once, and of the queue. */
  maxPerGroup: number;
  maxRunning: number;
  /** Every reader count readersChanged reported. */
  readers: number[];
}

async function drain(queue: string, total: number, options: QueueOptions): Promise<Run> {
  const run: Run = { order: new Map(), maxPerGroup: 0, maxRunning: 0, readers: [] };
  const runningPerGroup = new Map<string, number>();
  let running = 0;
  let finished = 0;
  const consumer = new SqlQueueConsumer({
    store: db.store,
    clock: systemClock,
    logger: silentLogger,
    listeners: [{ readersChanged: (event) => void run.readers.push(event.readers) }],
    wakeBus: new WakeBus(),
    workerId: 'one-group',
    listenForWakeups: false,
  });
  consumer.register(
    resolveQueueOptions(queue, { handler: { minPollMs: 5, maxPollMs: 50, ...options } }, resolveConsumerOptions({})),
    async (_payload, context) => {
      const key = context.groupKey!;
      const now = (runningPerGroup.get(key) ?? 0) + 1;
      runningPerGroup.set(key, now);
      running++;
      run.maxPerGroup = Math.max(run.maxPerGroup, now);
      run.maxRunning = Math.max(run.maxRunning, running);
      run.order.set(key, [...(run.order.get(key) ?? []), context.jobId]);
      // Yield to the event loop, so that another reader could start a job meanwhile if it had one.
      await new Promise((resolve) => setImmediate(resolve));
      runningPerGroup.set(key, runningPerGroup.get(key)! - 1);
      running--;
      finished++;
    },
  );
  await consumer.start();
  try {
    await waitFor(
      () => finished,
      (n) => n >= total,
      { timeoutMs: 60_000, intervalMs: 50, what: `${total} jobs of ${queue} to run` },
    );
    await waitFor(
      () => db.store.stats(queue),
      (s) => s.ready + s.delayed + s.leased === 0,
      { what: `${queue} to be drained` },
    );
  } finally {
    await consumer.stop(5_000);
  }
  return run;
}

describe('one group with a thousand jobs, maxReaders 8', () => {
  it('runs one job at a time, in id order, on one reader', async () => {
    const queue = 'one-group';
    const ids = await enqueueIds(
      db.store,
      Array.from({ length: 1_000 }, (_, n) => groupJob(queue, 'the-group', { n })),
    );
    const run = await drain(queue, ids.length, { minReaders: 1, maxReaders: 8 });
    expect(run.order.get('the-group')).toEqual(ids);
    expect(run.maxPerGroup).toBe(1);
    expect(Math.max(0, ...run.readers)).toBeLessThanOrEqual(1);
  });

  it('with groupBatchSize 10: batches run in order on one reader too', async () => {
    const queue = 'one-group-batched';
    const ids = await enqueueIds(
      db.store,
      Array.from({ length: 300 }, (_, n) => groupJob(queue, 'the-group', { n })),
    );
    const run = await drain(queue, ids.length, { minReaders: 1, maxReaders: 8, groupBatchSize: 10 });
    expect(run.order.get('the-group')).toEqual(ids);
    expect(run.maxPerGroup).toBe(1);
    expect(Math.max(0, ...run.readers)).toBeLessThanOrEqual(1);
  });

  it('control: with eight groups the readers grow, each group still one job at a time in id order', async () => {
    const queue = 'eight-groups';
    const jobs = Array.from({ length: 400 }, (_, n) => groupJob(queue, `g${n % 8}`, { n }));
    const ids = await enqueueIds(db.store, jobs);
    const run = await drain(queue, ids.length, { minReaders: 1, maxReaders: 8 });
    for (let g = 0; g < 8; g++) {
      expect(run.order.get(`g${g}`)).toEqual(ids.filter((_, n) => n % 8 === g));
    }
    expect(run.maxPerGroup).toBe(1);
    expect(Math.max(0, ...run.readers)).toBeGreaterThan(1);
    expect(run.maxRunning).toBeGreaterThan(1);
  });
});
