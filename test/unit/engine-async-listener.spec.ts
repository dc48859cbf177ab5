import { describe, expect, it } from 'vitest';
import { safeEmit, type QueueEventListener } from '../../lib/src/core/events.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import { engineDeps, queueOptions, recordUnhandledRejections, stopOnFakeClock } from '../helpers/engine.js';
import { FakeClock, settle } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, safeEmit() promises that "a metrics listener must never break
 * job processing" and catches synchronous throws. An async listener (`completed: async (e) => { await push(e)
 * }` type-checks against the `void` return) that rejects escapes it: the rejected promise is dropped, which
 * is an unhandled rejection, and Node 20 terminates the process on one by default.
 */
describe('an async QueueEventListener that rejects', () => {
  const rejections = recordUnhandledRejections();

  it('safeEmit contains it', async () => {
    const listener: QueueEventListener = {
      emptyClaim: async () => {
        throw new Error('metrics backend down');
      },
    };
    safeEmit([listener], 'emptyClaim', { queue: 'q' });
    await settle(); // unhandled rejections are reported once the microtask queue drains
    expect(rejections).toEqual([]);
  });

  it('a consumer keeps running and nothing goes unhandled', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    store.add(3);
    const listener: QueueEventListener = {
      completed: async () => {
        throw new Error('metrics backend down');
      },
    };
    const consumer = new QueueConsumer(
      engineDeps(store, clock, { listeners: [listener] }),
      queueOptions({ minReaders: 1, maxReaders: 1 }),
      async () => undefined,
    );
    consumer.start();
    await clock.advance(1_000);
    await stopOnFakeClock(consumer, clock);
    await settle(); // unhandled rejections are reported once the microtask queue drains
    expect(rejections).toEqual([]);
  });
});
