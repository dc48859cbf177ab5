import { describe, expect, it } from 'vitest';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import type { HeartbeatItem, OwnedJob } from '../../lib/src/core/types.js';
import { engineDeps, queueOptions, stopOnFakeClock } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. With `prefetch: 'auto'`, a buffer filled while handlers were fast
 * stayed full when they turned slow: the target learned only from finished handlers, and
 * nothing gave the surplus back. Heartbeats cannot extend a lease past claim + maxDurationMs, so
 * buffered jobs lost their lease without ever running, and the reaper counted the attempt.
 */

/** A MemoryStore whose heartbeat caps the lease at claim + maxDurationMs, as both dialects do. */
class CappedStore extends MemoryStore {
  private readonly claimedAt = new Map<string, number>();

  constructor(private readonly clock: FakeClock) {
    super();
  }

  override async claim(request: { limit: number }) {
    const jobs = await super.claim(request);
    for (const job of jobs) this.claimedAt.set(job.id, this.clock.now());
    return jobs;
  }

  readonly released: string[] = [];

  override async release(items: readonly OwnedJob[]) {
    this.released.push(...items.map((item) => item.id));
    return super.release(items);
  }

  override async heartbeat(items: readonly HeartbeatItem[]) {
    return items.map((item) => {
      const lost = item.maxDurationMs !== null && this.clock.now() >= this.claimedAt.get(item.id)! + item.maxDurationMs;
      return { id: item.id, outcome: lost ? ('lost' as const) : ('ok' as const), leaseUntil: new Date() };
    });
  }
}

describe("prefetch 'auto' when handlers turn slow", () => {
  it('gives the surplus buffer back at once, so no prefetched job loses its lease without running', async () => {
    const clock = new FakeClock();
    const store = new CappedStore(clock);
    store.claimDelay = () => clock.sleep(2);
    let slow = false;
    const started = new Set<string>();
    const lostUnstarted: string[] = [];
    const consumer = new QueueConsumer(
      engineDeps(store, clock, {
        listeners: [{ lostOwnership: (e) => void (started.has(e.jobId) || lostUnstarted.push(e.jobId)) }],
      }),
      // The README's defaults otherwise: batchSize 100, prefetch 'auto', maxDurationMs 1 h.
      queueOptions({ maxReaders: 5 }),
      async (_payload, context) => {
        started.add(context.jobId);
        await clock.sleep(slow ? 120_000 : 0);
      },
    );
    consumer.start();
    store.add(50);
    await clock.advance(200); // fast jobs: the target climbs to 2 × batchSize
    slow = true; // 2 minutes per job from now on
    store.add(1_000);
    await clock.advance(6_000);
    // Every slot busy with a slow job: nothing waits here that another process could run.
    expect(consumer.snapshot()).toMatchObject({ running: 5, buffered: 0 });
    await clock.advance(2 * 3_600_000);
    expect(lostUnstarted).toEqual([]);
    await stopOnFakeClock(consumer, clock);
  });

  it('gives back a job that waited half its maxDurationMs, whatever the prefetch setting', async () => {
    const clock = new FakeClock();
    const store = new CappedStore(clock);
    const lost: string[] = [];
    const consumer = new QueueConsumer(
      engineDeps(store, clock, { listeners: [{ lostOwnership: (e) => void lost.push(e.jobId) }] }),
      queueOptions({ maxReaders: 1, prefetch: 5, maxDurationMs: 60_000, leaseMs: 30_000 }),
      () => clock.sleep(50_000),
    );
    consumer.start();
    store.add(6);
    await clock.advance(1);
    expect(consumer.snapshot()).toMatchObject({ running: 1, buffered: 5 });
    const buffered = ['2', '3', '4', '5', '6'];
    await clock.advance(35_000);
    // The buffered jobs waited 30 s of their 60 s: all given back to ready, attempt not counted.
    expect(store.released.sort()).toEqual(buffered);
    expect(consumer.snapshot().buffered).toBe(0);
    // Past the 60 s cap of their first claim, none of them was reported lost.
    await clock.advance(30_000);
    expect(lost).toEqual([]);
    await stopOnFakeClock(consumer, clock);
  });
});
