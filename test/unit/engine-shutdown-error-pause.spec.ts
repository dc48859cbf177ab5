import { describe, expect, it } from 'vitest';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import { capturingLogger, engineDeps, queueOptions } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { deferred } from '../helpers/wait-for.js';

/**
 * Regression, found in review. Before the fix, a claim in flight when shutdown begins, that then fails (the
 * database is going away: a common reason to shut down), starts an error pause AFTER stop() aborted
 * `idleSleep`. Nothing ends that pause, so stop() waits on it (up to timeoutMs + 1 s) and warns of a claim
 * "still in flight" although the claim already failed.
 */
describe('a claim failing during shutdown', () => {
  it('does not pause after the queue started stopping', async () => {
    const clock = new FakeClock();
    const { logger, lines: warnings } = capturingLogger('warn');
    let hang: ReturnType<typeof deferred<never>> | null = null;
    const store = {
      claims: 0,
      async claim() {
        this.claims++;
        if (hang) return hang.promise;
        throw new Error('connection refused');
      },
    };
    const consumer = new QueueConsumer(
      engineDeps(store, clock, { logger }),
      queueOptions({ minReaders: 1, maxReaders: 1 }),
      async () => undefined,
    );
    consumer.start();
    // Failing claims: the error backoff climbs to its 5 s cap.
    await clock.advance(20_000);
    expect(store.claims).toBeGreaterThan(4);
    hang = deferred<never>();
    await clock.advance(5_000); // the next claim is sent and hangs
    const sent = store.claims;

    const started = Date.now();
    const stopping = consumer.stop(0);
    hang.reject(new Error('connection terminated')); // the claim fails once shutdown has begun
    await stopping;
    const took = Date.now() - started;
    expect(store.claims).toBe(sent);
    expect(warnings.filter((w) => w.includes('claim was still in flight'))).toEqual([]);
    expect(took).toBeLessThan(500);
  }, 30_000);
});
