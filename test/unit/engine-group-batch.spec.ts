import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import type { ClaimedJob, FailItem, OwnedJob } from '../../lib/src/core/types.js';
import { claimedJob, engineDeps, queueOptions, stopOnFakeClock } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * The engine's side of an ordered group's batch (`groupBatchSize`): the store leases a group's
 * head and the jobs after it under one claim token; one reader runs them in id order, each after
 * the one before it completed. What the database does with them is proven by the contract suite.
 */
class BatchStore extends MemoryStore {
  readonly completed: string[] = [];
  /** When set, each complete statement waits for this gate and answers what it returns. */
  completeGate: ((ids: string[]) => Promise<'ok' | 'lost'>) | null = null;
  readonly failed: string[] = [];
  readonly released: string[] = [];
  /** Every outcome statement, in the order sent. */
  readonly statements: string[] = [];
  private batch: ClaimedJob[] | null;

  constructor(ids: string[]) {
    super();
    const token = randomUUID();
    // Out of order on purpose: the engine orders a batch by id, not by the statement's row order.
    this.batch = ids.map((id) => claimedJob(id, token, { groupKey: 'order-1' }));
  }

  override async claim(request: { limit: number }): Promise<ClaimedJob[]> {
    this.claimLimits.push(request.limit);
    const batch = this.batch ?? [];
    this.batch = null;
    return batch;
  }

  override async complete(items: readonly OwnedJob[]) {
    const ids = items.map((item) => item.id);
    this.statements.push(`complete ${ids.join(',')}`);
    const outcome = this.completeGate ? await this.completeGate(ids) : 'ok';
    if (outcome === 'ok') this.completed.push(...ids);
    return items.map((item) => ({ id: item.id, outcome }));
  }

  override async fail(items: readonly FailItem[]) {
    this.failed.push(...items.map((item) => item.id));
    this.statements.push(`fail ${items.map((item) => item.id).join(',')}`);
    return items.map((item) => ({ id: item.id, outcome: 'ok' as const, state: 'ready' as const }));
  }

  override async release(items: readonly OwnedJob[]) {
    this.released.push(...items.map((item) => item.id));
    return items.map((item) => ({ id: item.id, outcome: 'ok' as const }));
  }
}

function run(
  store: BatchStore,
  handler: (id: string, clock: FakeClock) => Promise<void>,
  options: { maxDurationMs?: number } = {},
) {
  const clock = new FakeClock();
  const spans: { id: string; start: number; end: number }[] = [];
  const consumer = new QueueConsumer(
    engineDeps(store, clock),
    queueOptions({ maxReaders: 4, groupBatchSize: 3, ...options }),
    async (_payload, context) => {
      const start = clock.now();
      await handler(context.jobId, clock);
      spans.push({ id: context.jobId, start, end: clock.now() });
    },
  );
  return { clock, consumer, spans };
}

describe('a group batch', () => {
  it('runs on one reader, in id order, each job after the one before it', async () => {
    const store = new BatchStore(['12', '10', '11']);
    const started = run(store, (_id, clock) => clock.sleep(100));
    const { clock } = started;
    started.consumer.start();
    await clock.advance(1_000);
    expect(started.spans.map((s) => s.id)).toEqual(['10', '11', '12']);
    for (let i = 1; i < started.spans.length; i++) {
      expect(started.spans[i]!.start).toBeGreaterThanOrEqual(started.spans[i - 1]!.end);
    }
    expect(store.completed).toEqual(['10', '11', '12']);
    // One unit of work: the claim asked for the free slots, and no reader beyond one ran it.
    expect(started.consumer.snapshot().running).toBe(0);
    await stopOnFakeClock(started.consumer, clock);
  });

  it('starts the next job only once the one before is done in the database, not when its completion was sent', async () => {
    const store = new BatchStore(['10', '11', '12']);
    const answers: (() => void)[] = [];
    store.completeGate = () => new Promise((resolve) => answers.push(() => resolve('ok')));
    const started = run(store, () => Promise.resolve());
    const { clock } = started;
    started.consumer.start();
    await clock.advance(500);
    // 10 ran and its completion is in flight: 11 waits for it (a crash now must not run 10
    // again after 11 ran).
    expect(started.spans.map((s) => s.id)).toEqual(['10']);
    expect(store.statements).toEqual(['complete 10']);
    answers.shift()!();
    await clock.advance(500);
    expect(started.spans.map((s) => s.id)).toEqual(['10', '11']);
    answers.shift()!();
    await clock.advance(500);
    answers.shift()!();
    await clock.advance(500);
    expect(started.spans.map((s) => s.id)).toEqual(['10', '11', '12']);
    expect(store.completed).toEqual(['10', '11', '12']);
    await stopOnFakeClock(started.consumer, clock);
  });

  it("stops when a completion is refused as lost: the batch is no longer this worker's, its next job runs nowhere here", async () => {
    const store = new BatchStore(['10', '11', '12']);
    store.completeGate = async () => 'lost';
    const started = run(store, () => Promise.resolve());
    const { clock } = started;
    started.consumer.start();
    await clock.advance(1_000);
    expect(started.spans.map((s) => s.id)).toEqual(['10']);
    expect(store.completed).toEqual([]);
    expect(store.released).toEqual([]);
    await stopOnFakeClock(started.consumer, clock);
  });

  it('stops at a failure and leaves the rest to the failure statement, which gives them back', async () => {
    const store = new BatchStore(['1', '2', '3']);
    const { clock, consumer, spans } = run(store, async (id) => {
      if (id === '2') throw new Error('boom');
    });
    consumer.start();
    await clock.advance(1_000);
    expect(spans.map((s) => s.id)).toEqual(['1']);
    // Job 1's completion is recorded before job 2's failure, which gives back the batch's jobs
    // still leased: sent after it, job 1 would be given back too and run again.
    expect(store.statements).toEqual(['complete 1', 'fail 2']);
    // Job 3 never ran, and is not given back from here (the database already did, with job 2's
    // failure), nor heartbeated any longer.
    expect(store.released).toEqual([]);
    await stopOnFakeClock(consumer, clock);
    expect(store.released).toEqual([]);
  });

  it('at shutdown, finishes the running job and gives the rest of its batch back', async () => {
    const store = new BatchStore(['1', '2', '3']);
    const started = run(store, (_id, clock) => clock.sleep(500));
    const { clock } = started;
    started.consumer.start();
    await clock.advance(100);
    expect(started.consumer.snapshot().running).toBe(1);
    await stopOnFakeClock(started.consumer, clock);
    expect(store.completed).toEqual(['1']);
    expect(store.released.sort()).toEqual(['2', '3']);
    expect(started.spans.map((s) => s.id)).toEqual(['1']);
  });

  it('gives the rest back once half of maxDurationMs has passed since the claim, which heartbeats cannot extend', async () => {
    const store = new BatchStore(['1', '2', '3']);
    const started = run(store, (_id, clock) => clock.sleep(40_000), { maxDurationMs: 60_000 });
    const { clock } = started;
    started.consumer.start();
    await clock.advance(90_000);
    // Job 1 took 40 s, past half of the 60 s cap: jobs 2 and 3 go back rather than start with
    // 20 s of lease left.
    expect(store.completed).toEqual(['1']);
    expect(store.released.sort()).toEqual(['2', '3']);
    await stopOnFakeClock(started.consumer, clock);
  });
});
