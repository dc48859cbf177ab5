import { afterEach, describe, expect, it } from 'vitest';
import {
  autoPrefetch,
  claimSize,
  readersToStart,
  shouldRetireAfterEmptyClaim,
} from '../../lib/src/core/consumer/activation.js';
import type { QueueOptions } from '../../lib/src/core/options.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import { engineDeps, queueOptions } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

describe('the activation rule (seed 003)', () => {
  it('starts a reader for each claimed job no idle reader took, never above maxReaders', () => {
    expect(readersToStart(1, 10, 9)).toBe(9);
    expect(readersToStart(1, 10, 50)).toBe(9);
    expect(readersToStart(10, 10, 50)).toBe(0);
    expect(readersToStart(3, 10, 0)).toBe(0);
  });

  it('retires a reader after an empty claim only while more than minReaders run', () => {
    expect(shouldRetireAfterEmptyClaim(3, 1)).toBe(true);
    expect(shouldRetireAfterEmptyClaim(1, 1)).toBe(false);
  });

  it('asks for every free handler slot plus the prefetch target, at most batchSize', () => {
    const idle = { maxReaders: 10, batchSize: 100, prefetch: 0, running: 0, buffered: 0, requested: 0 };
    expect(claimSize(idle)).toBe(10);
    expect(claimSize({ ...idle, running: 7 })).toBe(3);
    expect(claimSize({ ...idle, running: 10 })).toBe(0);
    expect(claimSize({ ...idle, batchSize: 4 })).toBe(4);
    expect(claimSize({ ...idle, prefetch: 50 })).toBe(60);
    expect(claimSize({ ...idle, prefetch: 500 })).toBe(100);
    expect(claimSize({ ...idle, running: 3, buffered: 2, requested: 4 })).toBe(1);
  });

  it('with every slot covered, tops up a prefetch buffer only once it is half empty', () => {
    const busy = { maxReaders: 10, batchSize: 100, prefetch: 40, running: 10, buffered: 0, requested: 0 };
    expect(claimSize({ ...busy, buffered: 21 })).toBe(0);
    expect(claimSize({ ...busy, buffered: 20 })).toBe(20);
    expect(claimSize({ ...busy, buffered: 5, requested: 16 })).toBe(0);
  });

  it("prefetch 'auto' covers two claim round trips at the handlers' pace, none for long jobs", () => {
    const base = { maxReaders: 10, batchSize: 100 };
    expect(autoPrefetch({ ...base, claimMs: null, handlerMs: 1 })).toBe(0);
    expect(autoPrefetch({ ...base, claimMs: 2, handlerMs: null })).toBe(0);
    // 10 handlers of 10 ms finish 2 jobs per 2 ms claim: 4 cover two round trips.
    expect(autoPrefetch({ ...base, claimMs: 2, handlerMs: 10 })).toBe(4);
    expect(autoPrefetch({ ...base, claimMs: 2, handlerMs: 1_000 })).toBe(0);
    // A no-op handler: two claims' worth, so two full claims can overlap.
    expect(autoPrefetch({ ...base, claimMs: 2, handlerMs: 0 })).toBe(200);
    expect(autoPrefetch({ ...base, batchSize: 30, claimMs: 1, handlerMs: 0.5 })).toBe(40);
    expect(autoPrefetch({ ...base, batchSize: 10, claimMs: 1, handlerMs: 0.5 })).toBe(20);
  });
});

describe('a queue consumer on a fake clock', () => {
  let consumer: QueueConsumer | null = null;
  let clock: FakeClock;

  afterEach(async () => {
    // Shutdown waits on the engine clock too, so time has to move while it stops.
    const stopping = consumer?.stop(0);
    await clock.advance(20_000);
    await stopping;
    consumer = null;
  });

  function start(store: MemoryStore, queue: QueueOptions, handler: () => Promise<void>) {
    clock = new FakeClock();
    const readers: number[] = [];
    consumer = new QueueConsumer(
      engineDeps(store, clock, { listeners: [{ readersChanged: (e) => readers.push(e.readers) }] }),
      queueOptions(queue),
      handler,
    );
    consumer.start();
    return readers;
  }

  it('grows to maxReaders at the first claim that brings work for them, never above it', async () => {
    const store = new MemoryStore();
    store.add(1_000);
    // Each job takes 10 s of engine time: readers never catch up.
    const readers = start(store, { minReaders: 1, maxReaders: 3 }, () => clock.sleep(10_000));
    await clock.advance(1);
    expect(consumer!.snapshot()).toMatchObject({ readers: 3, running: 3 });
    expect(store.claimLimits[0]).toBe(3);
    await clock.advance(60_000);
    expect(consumer!.snapshot().readers).toBe(3);
    expect(Math.max(...readers)).toBe(3);
    // No prefetch for 10 s jobs: a claim asks only for the slots that are free.
    expect(Math.max(...store.claimLimits)).toBe(3);
  });

  it('short jobs behind slow claims: readers grow at once and claims fill every free slot (issue 9)', async () => {
    const store = new MemoryStore();
    store.add(8_000);
    // Every claim takes 2 ms of engine time; handlers take 1 ms. The old rule kept one reader,
    // which spent its time waiting on the next claim, and claimed one job at a time.
    store.claimDelay = () => clock.sleep(2);
    const readers = start(store, { maxReaders: 10 }, () => clock.sleep(1));
    await clock.advance(5_000);
    expect(store.readyCount).toBe(0);
    expect(Math.max(...readers)).toBe(10);
    // 8,000 jobs in claims of 10 or more (prefetch 'auto' asks for more once it has measured).
    expect(store.claims).toBeLessThanOrEqual(8_000 / 10 + 10);
    expect(Math.max(...store.claimLimits)).toBeGreaterThan(10);
    expect(Math.max(...store.claimLimits)).toBeLessThanOrEqual(100);
  });

  it('with prefetch 0, a claim never asks for more than the free slots', async () => {
    const store = new MemoryStore();
    store.add(500);
    store.claimDelay = () => clock.sleep(2);
    start(store, { maxReaders: 4, prefetch: 0 }, () => clock.sleep(1));
    await clock.advance(5_000);
    expect(store.readyCount).toBe(0);
    expect(Math.max(...store.claimLimits)).toBe(4);
  });

  it("prefetch 'auto' holds nothing ahead of long jobs", async () => {
    const store = new MemoryStore();
    store.add(100);
    store.claimDelay = () => clock.sleep(2);
    start(store, { maxReaders: 2 }, () => clock.sleep(1_000));
    await clock.advance(10_000);
    expect(consumer!.snapshot()).toMatchObject({ running: 2, buffered: 0 });
    expect(Math.max(...store.claimLimits)).toBe(2);
  });

  it('a trickle that one reader keeps up with stays at one reader', async () => {
    const store = new MemoryStore();
    // Every job is claimed at once by the idle reader, and its claims keep coming back empty.
    const readers = start(store, { minReaders: 1, maxReaders: 4, minPollMs: 100, maxPollMs: 500 }, async () => {});
    for (let second = 0; second < 20; second++) {
      store.add(1);
      await clock.advance(1_000);
    }
    expect(store.readyCount).toBe(0);
    expect(store.emptyClaims).toBeGreaterThan(0);
    expect(Math.max(...readers)).toBe(1);
  });

  it('retires readers to minReaders once claims come back empty', async () => {
    const store = new MemoryStore();
    store.add(200);
    start(store, { minReaders: 1, maxReaders: 4 }, () => clock.sleep(1_000));
    await clock.advance(4_000);
    expect(consumer!.snapshot().readers).toBe(4);
    await clock.advance(120_000);
    expect(store.readyCount).toBe(0);
    expect(consumer!.snapshot().readers).toBe(1);
  });

  it('starts the stall clock when a reader begins to wait, not at the last claim before a long job', async () => {
    const store = new MemoryStore();
    store.add(1);
    // After the first claim, claims hang (a slow database): only the waiting reader moves the clock.
    const firstClaim = store.claim.bind(store);
    let claims = 0;
    store.claim = (request) => (++claims === 1 ? firstClaim(request) : new Promise(() => undefined));
    start(store, { minReaders: 1, maxReaders: 1, minPollMs: 50, maxPollMs: 1_000 }, () => clock.sleep(90_000));
    await clock.advance(89_000);
    expect(consumer!.snapshot().running).toBe(1);
    await clock.advance(2_000);
    // The 90 s job finished at 90 s; the reader has waited 1 s on a claim that has not returned.
    const snapshot = consumer!.snapshot();
    expect(snapshot.running).toBe(0);
    expect(clock.now() - snapshot.lastLoopAt).toBeLessThanOrEqual(1_000);
  });

  it('an idle queue claims at a rate bounded by maxPollMs, never hot-looping', async () => {
    const store = new MemoryStore();
    start(store, { minReaders: 2, maxReaders: 2, minPollMs: 50, maxPollMs: 1_000 }, async () => {});
    await clock.advance(60_000);
    // One claim loop per queue: pauses 50, 100, 200, 400, 800, then 1000 ms each.
    // 5 claims during the 1.55 s ramp-up, then one per second: 5 + floor(58.45) + 1 = 64 at most.
    expect(store.claims).toBeLessThanOrEqual(64);
    expect(store.claims).toBeGreaterThanOrEqual(60);
    const before = store.claims;
    consumer!.wake();
    await clock.advance(1);
    expect(store.claims).toBe(before + 1);
  });
});
