import { describe, expect, it } from 'vitest';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import { engineDeps, pendingTimers, queueOptions, untilAborted } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, execute() starts the abandon grace sleep when a job is aborted
 * and never cancels it when the handler then settles. With the system clock that is a plain (ref'd)
 * setTimeout: after a shutdown that aborted handlers, stop() resolves but the process cannot exit for another
 * SHUTDOWN_ABANDON_GRACE_MS per aborted job (5 s for a job aborted by a lost lease).
 */
describe('abandon grace timer', () => {
  it('is cancelled when the aborted handler settles', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    store.add(1);
    const consumer = new QueueConsumer(
      engineDeps(store, clock),
      queueOptions({ minReaders: 1, maxReaders: 1 }),
      (_payload: unknown, ctx: JobContext) => untilAborted(ctx.signal),
    );
    consumer.start();
    await clock.advance(100);
    expect(consumer.snapshot().running).toBe(1);
    const stopping = consumer.stop(500);
    await clock.advance(500); // the deadline passes: the handler is aborted and stops at once
    await stopping;
    expect(pendingTimers(clock)).toEqual([]);
  });
});
