import { describe, expect, it } from 'vitest';
import { systemClock } from '../../lib/src/core/clock.js';
import { silentLogger, type QueueLogger } from '../../lib/src/core/logger.js';
import { QueueConsumer } from '../../lib/src/core/queue-consumer.js';
import { capturingLogger, engineDeps, queueOptions } from '../helpers/engine.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, with prefetch > 0 two claims are in flight at once. When both
 * come back empty, each one pauses, but `idleSleep` only remembers the last pause: wake() and stop() cannot
 * end the other one, so shutdown waits for a poll pause it was meant to cut short.
 */

/** A consumer on the system clock that pipelines two claims and pauses 20 s after an empty one. */
function pipeliningConsumer(store: MemoryStore, logger: QueueLogger = silentLogger): QueueConsumer {
  return new QueueConsumer(
    engineDeps(store, systemClock, { logger, activationIntervalMs: 60_000, activationQuietMs: 60_000 }),
    queueOptions({ minReaders: 1, maxReaders: 5, prefetch: 10, minPollMs: 20_000, maxPollMs: 20_000 }),
    async () => undefined,
  );
}

describe('two empty pipelined claims', () => {
  it('stop() ends every idle pause at once', async () => {
    const store = new MemoryStore();
    const { logger, lines: warnings } = capturingLogger('warn');
    const consumer = pipeliningConsumer(store, logger);
    consumer.start();
    // Let both pipelined claims come back empty and start their pauses.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(store.claims).toBe(2);

    const started = Date.now();
    await consumer.stop(3_000);
    const took = Date.now() - started;
    // Nothing runs and nothing is in flight but a pause: shutdown should be immediate.
    expect(warnings.filter((w) => w.includes('claim was still in flight'))).toEqual([]);
    expect(took).toBeLessThan(500);
  }, 30_000);

  it('wake() ends every idle pause (second claim slot is not parked for a whole poll pause)', async () => {
    const store = new MemoryStore();
    const consumer = pipeliningConsumer(store);
    consumer.start();
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(store.claims).toBe(2);
    consumer.wake();
    await new Promise((resolve) => setTimeout(resolve, 50));
    // Both slots should claim again after a wake-up; only one does, the other sleeps on.
    expect(store.claims).toBe(4);
    const stopping = consumer.stop(0);
    await stopping;
  }, 30_000);
});
