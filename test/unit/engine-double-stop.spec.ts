import { describe, expect, it } from 'vitest';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import { consumerDeps, queueOptions } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, a second stop() while the first is still draining returns at
 * once (state is 'stopping', not 'running', so it sets 'stopped' and returns). A caller that awaits it and
 * then closes the pool (a second shutdown path, a test's afterAll, two signals) closes connections under
 * running handlers and queued outcomes, and snapshot() already says the consumer is stopped.
 */
describe('stop() called twice', () => {
  it('the second call resolves only when the consumer has stopped', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    store.add(1);
    const consumer = new SqlQueueConsumer(consumerDeps(store, clock, { listenForWakeups: false }));
    consumer.register(
      queueOptions({ minReaders: 1, maxReaders: 1 }),
      () => clock.sleep(5_000), // a handler that finishes within the shutdown timeout
    );
    await consumer.start();
    await clock.advance(100);
    let firstDone = false;
    let secondDone = false;
    const first = consumer.stop(10_000).then(() => (firstDone = true));
    await clock.advance(10);
    const second = consumer.stop(10_000).then(() => (secondDone = true));
    await clock.advance(10);
    // The handler still runs: neither call may have returned.
    expect(secondDone).toBe(false);
    expect(consumer.snapshot().running).toBe(false);
    await clock.advance(20_000);
    await Promise.all([first, second]);
    expect(firstDone && secondDone).toBe(true);
  });
});
