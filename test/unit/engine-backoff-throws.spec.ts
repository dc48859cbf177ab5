import { describe, expect, it } from 'vitest';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import type { FailItem, HeartbeatItem } from '../../lib/src/core/types.js';
import { engineDeps, queueOptions, recordUnhandledRejections, stopOnFakeClock } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

/**
 * Regression, found in review. Before the fix, a custom backoff `(attempt, error) => ms` is called on the
 * reader's path (execute()) with no guard. backoff.ts protects against a policy that RETURNS garbage ("must
 * not lose the job"), but not one that THROWS, e.g. one that reads `error.response.status` and meets an error
 * without a response. The throw escapes execute() -> run() -> readLoop(): the reader dies with an unhandled
 * rejection, the failure is never recorded, and the job stays in `held`, so the lease keeper renews its lease
 * forever: the job is neither retried nor reaped while this process lives.
 */
describe('a custom backoff policy that throws', () => {
  const rejections = recordUnhandledRejections();

  it('records the failure (with a fallback delay) instead of killing the reader and pinning the lease', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const fails: FailItem[] = [];
    const heartbeats: HeartbeatItem[] = [];
    const baseHeartbeat = store.heartbeat.bind(store);
    Object.assign(store, {
      async fail(items: readonly FailItem[]) {
        fails.push(...items);
        return items.map((item) => ({ id: item.id, outcome: 'ok' as const, state: 'ready' as const }));
      },
      async heartbeat(items: readonly HeartbeatItem[]) {
        heartbeats.push(...items);
        return baseHeartbeat(items);
      },
    });
    store.add(1);
    type HttpError = Error & { response: { status: number } };
    const consumer = new QueueConsumer(
      engineDeps(store, clock),
      queueOptions({
        minReaders: 1,
        maxReaders: 1,
        leaseMs: 3_000,
        backoff: (_attempt, error) => ((error as HttpError).response.status === 429 ? 60_000 : 1_000),
      }),
      async () => {
        throw new Error('ECONNRESET'); // not an HTTP error: no .response
      },
    );
    consumer.start();
    await clock.advance(60_000);
    await stopOnFakeClock(consumer, clock);

    expect(rejections).toEqual([]);
    expect(fails.map((f) => f.id)).toEqual(['1']);
    // A finished handler's job must not be kept leased by heartbeats.
    expect(heartbeats.length).toBeLessThan(3);
  });
});
