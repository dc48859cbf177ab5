import { afterEach, describe, expect, it } from 'vitest';
import { shouldAddReader, shouldRetireAfterEmptyClaim } from '../../lib/src/core/activation.js';
import type { QueueOptions } from '../../lib/src/core/options.js';
import { QueueConsumer } from '../../lib/src/core/queue-consumer.js';
import { engineDeps, queueOptions } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

const base = { readers: 2, minReaders: 1, maxReaders: 4, lastEmptyClaimAt: 1_000, now: 5_000, quietMs: 2_000 };

describe('the activation rule (seed 003)', () => {
  it('adds a reader only with claimable work and no empty claim for the quiet period', () => {
    expect(shouldAddReader({ ...base, hasClaimableWork: true })).toBe(true);
    expect(shouldAddReader({ ...base, hasClaimableWork: false })).toBe(false);
    expect(shouldAddReader({ ...base, lastEmptyClaimAt: 3_500, hasClaimableWork: true })).toBe(false);
    expect(shouldAddReader({ ...base, lastEmptyClaimAt: 3_000, hasClaimableWork: true })).toBe(true);
    expect(shouldAddReader({ ...base, lastEmptyClaimAt: null, hasClaimableWork: true })).toBe(true);
  });

  it('never goes above maxReaders, and restores minReaders whenever there is work', () => {
    expect(shouldAddReader({ ...base, readers: 4, lastEmptyClaimAt: null, hasClaimableWork: true })).toBe(false);
    expect(shouldAddReader({ ...base, readers: 0, lastEmptyClaimAt: 4_999, hasClaimableWork: true })).toBe(true);
  });

  it('retires a reader after an empty claim only while more than minReaders run', () => {
    expect(shouldRetireAfterEmptyClaim(3, 1)).toBe(true);
    expect(shouldRetireAfterEmptyClaim(1, 1)).toBe(false);
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

  it('adds readers one per tick while work waits and readers keep up no longer, up to maxReaders', async () => {
    const store = new MemoryStore();
    store.add(1_000);
    // Each job takes 10 s of engine time: readers never catch up.
    const readers = start(store, { minReaders: 1, maxReaders: 3 }, () => clock.sleep(10_000));
    await clock.advance(500);
    expect(consumer!.snapshot().readers).toBe(1);
    await clock.advance(1_000);
    expect(consumer!.snapshot().readers).toBe(2);
    await clock.advance(1_000);
    expect(consumer!.snapshot().readers).toBe(3);
    await clock.advance(10_000);
    expect(consumer!.snapshot().readers).toBe(3);
    expect(Math.max(...readers)).toBe(3);
  });

  it('adds no reader while some reader has come back empty within the quiet period', async () => {
    const store = new MemoryStore();
    // A trickle: every job is claimed at once and readers keep coming back empty.
    const readers = start(store, { minReaders: 1, maxReaders: 4, minPollMs: 100, maxPollMs: 500 }, async () => {});
    for (let second = 0; second < 20; second++) {
      store.add(1);
      await clock.advance(1_000);
    }
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
