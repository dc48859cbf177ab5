import { describe, expect, it } from 'vitest';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import { consumerDeps, pendingTimers, queueOptions } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';
import { deferred } from '../helpers/wait-for.js';

/**
 * Regression, found in review. Before the fix, SqlQueueConsumer.start() sets state 'running' and then awaits
 * store.listen() (PostgreSQL: connect + LISTEN on a dedicated client). A stop() during that await (SIGTERM
 * while the app bootstraps; the Nest host assigns `this.consumer` before awaiting start()) finds no
 * `stopListening` yet and marks the consumer 'stopped'. When listen() then resolves, start() stores the
 * unsubscribe that nobody will call (the LISTEN connection stays open and keeps the process alive) and starts
 * every queue consumer after it was stopped: its heartbeat and activation intervals run forever.
 */
describe('stop() while start() awaits the wake-up listener', () => {
  it('closes the listener and starts no queue after the stop', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const listening = deferred<() => Promise<void>>();
    let unsubscribed = false;
    Object.assign(store, { listen: () => listening.promise });
    const consumer = new SqlQueueConsumer(consumerDeps(store, clock));
    consumer.register(queueOptions(), async () => undefined);
    const starting = consumer.start();
    await consumer.stop(0);
    listening.resolve(async () => {
      unsubscribed = true;
    });
    await starting;
    await clock.advance(10_000);
    expect(unsubscribed).toBe(true);
    // Timers of a started queue consumer are left on the clock: the heartbeat and activation
    // intervals keep firing after stop() returned.
    expect(pendingTimers(clock).length).toBe(0);
  });
});
