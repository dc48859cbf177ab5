import { afterEach, describe, expect, it, vi } from 'vitest';
import { systemClock } from '../../lib/src/core/clock.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import type { OwnedJob } from '../../lib/src/core/types.js';
import { capturingLogger, engineDeps, queueOptions } from '../helpers/engine.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, drain() gives up after 10 s while an outcome statement is
 * still in flight (bounded at min(max(leaseMs/2, 2 s), 30 s): 15 s with the default 30 s lease). stop()
 * resolves and the application closes the pool, but the acker's flush loop is still alive: when the bound
 * fires, the batch is re-queued and retried against the closed store, with ref'd retry sleeps, until giveUpAt
 * (2 × leaseMs): errors after shutdown and a process that cannot exit.
 */
/** Fake timers move time; real setImmediate turns (the engine defers claims and flushes with them) run between steps. */
async function advance(ms: number): Promise<void> {
  for (let t = 0; t < ms; t += 50) {
    for (let i = 0; i < 3; i++) await new Promise<void>((resolve) => setImmediate(resolve));
    await vi.advanceTimersByTimeAsync(Math.min(50, ms - t));
  }
  for (let i = 0; i < 3; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}

describe('the acker after stop()', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('sends nothing more once stop() has returned', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date'] });
    const store = new MemoryStore();
    store.add(1);
    let closed = false;
    let completesAfterStop = 0;
    let completes = 0;
    Object.assign(store, {
      complete(items: readonly OwnedJob[]) {
        completes++;
        if (closed) {
          completesAfterStop++;
          return Promise.reject(new Error('Cannot use a pool after calling end on the pool'));
        }
        void items;
        return new Promise(() => undefined); // a half-open connection: no reply, ever
      },
    });
    const { logger, lines: errors } = capturingLogger('error');
    const consumer = new QueueConsumer(
      engineDeps(store, systemClock, { logger }),
      queueOptions({ minReaders: 1, maxReaders: 1 }),
      async () => undefined,
    );
    consumer.start();
    await advance(100);
    expect(completes).toBe(1);

    let stopped = false;
    const stopping = consumer.stop(0).then(() => (stopped = true));
    await advance(11_000);
    expect(stopped).toBe(true);
    await stopping;
    closed = true; // the application closes its pool after the consumer stopped
    const errorsAtStop = errors.length;

    await advance(120_000);
    expect(completesAfterStop).toBe(0);
    expect(errors.slice(errorsAtStop)).toEqual([]);
  });
});
