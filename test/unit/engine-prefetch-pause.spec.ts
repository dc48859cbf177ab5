import { describe, expect, it } from 'vitest';
import { silentLogger, type QueueLogger } from '../../lib/src/core/logger.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import { capturingLogger, engineDeps, queueOptions, stopOnFakeClock } from '../helpers/engine.js';
import { FakeClock, settle } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, with prefetch > 0 two claims are in flight at once. When both
 * come back empty, each one pauses, but `idleSleep` only remembered the last pause: wake() and stop() could not
 * end the other one, so shutdown waited for a poll pause it was meant to cut short.
 */

/**
 * A consumer that pipelines two claims (claims of 5 for 5 free slots and a prefetch of 10) and
 * pauses 20 s (on the fake clock) after an empty one.
 */
function pipeliningConsumer(store: MemoryStore, clock: FakeClock, logger: QueueLogger = silentLogger): QueueConsumer {
  return new QueueConsumer(
    engineDeps(store, clock, { logger }),
    queueOptions({ minReaders: 1, maxReaders: 5, batchSize: 5, prefetch: 10, minPollMs: 20_000, maxPollMs: 20_000 }),
    async () => undefined,
  );
}

describe('two empty pipelined claims', () => {
  it('stop() ends every idle pause at once', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const { logger, lines: warnings } = capturingLogger('warn');
    const consumer = pipeliningConsumer(store, clock, logger);
    consumer.start();
    // Both pipelined claims come back empty and start their 20 s pauses.
    await clock.advance(10);
    expect(store.claims).toBe(2);

    let stopped = false;
    const stopping = consumer.stop(3_000).then(() => (stopped = true));
    // Nothing runs and nothing is in flight but the pauses: shutdown finishes without the clock
    // moving (a pause left running would hold it for the 20 s it sleeps).
    await settle();
    expect(stopped).toBe(true);
    expect(warnings.filter((w) => w.includes('claim was still in flight'))).toEqual([]);
    await stopping;
  });

  it('wake() ends every idle pause, and the loop claims again', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const consumer = pipeliningConsumer(store, clock);
    consumer.start();
    await clock.advance(10);
    expect(store.claims).toBe(2);
    consumer.wake();
    await clock.advance(10);
    // Both pauses ended (a pause left running would block every claim for 20 s); the queue was
    // last seen empty, so one claim goes out, not two.
    expect(store.claims).toBe(3);
    store.add(20);
    consumer.wake();
    await clock.advance(10);
    expect(store.readyCount).toBe(0);
    await stopOnFakeClock(consumer, clock);
  });
});
