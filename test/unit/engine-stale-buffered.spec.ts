import { describe, expect, it } from 'vitest';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import { engineDeps, queueOptions, stopOnFakeClock, untilAborted } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, a prefetched job whose lease could not be renewed before it
 * expired (heartbeats failing: a network partition) is aborted by the lease keeper, but left in the buffer,
 * and run() only skips jobs marked `lost`. So a reader later hands it to the handler anyway, with a lease
 * this process already believes expired: by then the reaper may have given it to another worker, and both run
 * it. A running job in the same situation is aborted; a job that has not started should simply not be
 * started.
 */
describe('a buffered job whose local lease ran out', () => {
  it('is not handed to a handler', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    store.add(2);
    Object.assign(store, {
      async heartbeat() {
        throw new Error('connect ETIMEDOUT'); // this process cannot reach the database
      },
    });
    const started: string[] = [];
    const consumer = new QueueConsumer(
      engineDeps(store, clock),
      queueOptions({ minReaders: 1, maxReaders: 1, prefetch: 1, leaseMs: 3_000 }),
      async (_payload: unknown, ctx: JobContext) => {
        started.push(`${ctx.jobId}${ctx.signal.aborted ? ' (signal already aborted)' : ''}`);
        if (ctx.jobId === '1') {
          // A long job that stops when told to.
          await untilAborted(ctx.signal);
        }
      },
    );
    consumer.start();
    await clock.advance(100);
    expect(started).toEqual(['1']);
    expect(consumer.snapshot().buffered).toBe(1);
    // Heartbeats fail; after leaseMs both leases are presumed gone: job 1 is aborted ...
    await clock.advance(10_000);
    // ... and job 2, which never started, must not start now.
    expect(started).toEqual(['1']);
    await stopOnFakeClock(consumer, clock);
  });
});
