import { describe, expect, it } from 'vitest';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import { consumerDeps, queueOptions } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, every other shutdown step is bounded (claims, handlers,
 * outcomes, heartbeats), but SqlQueueConsumer.stop() awaits the wake-up listener's unsubscribe without a
 * bound. With PostgreSQL that is `client.end()` on the LISTEN connection, which waits for the socket to
 * close: on a half-open connection (network cut) it waits until TCP keepalive gives up.
 */
describe('an unsubscribe that never settles', () => {
  it('does not hold stop() forever', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    Object.assign(store, { listen: async () => () => new Promise<void>(() => undefined) });
    const consumer = new SqlQueueConsumer(consumerDeps(store, clock));
    consumer.register(queueOptions(), async () => undefined);
    await consumer.start();
    let stopped = false;
    const stopping = consumer.stop(1_000).then(() => (stopped = true));
    await clock.advance(60_000);
    await Promise.race([stopping, new Promise((resolve) => setTimeout(resolve, 6_000))]);
    expect(stopped).toBe(true);
  }, 20_000);
});
