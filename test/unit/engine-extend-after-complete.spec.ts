import { describe, expect, it } from 'vitest';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import type { HeartbeatItem, OwnedJob } from '../../lib/src/core/types.js';
import { capturingLogger, engineDeps, queueOptions, stopOnFakeClock } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';
import { deferred } from '../helpers/wait-for.js';

/**
 * Regression, found in review. Before the fix, renewLeases() deliberately ignores a 'lost' heartbeat for a
 * job whose handler has returned ("its outcome is in flight, and that token-checked write decides and
 * reports"). extendLease() has no such guard: an extendLease() still in flight when the handler returns,
 * answered after the completion committed, calls markLost(): a successful job is logged as "lease lost;
 * aborting its handler" and counted as lost ownership (during 'heartbeat').
 */
describe('extendLease answered after the completion committed', () => {
  it('does not report lost ownership for a job that completed', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    store.add(1);
    const done = new Set<string>();
    const heartbeatReply = deferred<void>();
    const baseComplete = store.complete.bind(store);
    Object.assign(store, {
      async complete(items: readonly OwnedJob[]) {
        const results = await baseComplete(items);
        for (const r of results) if (r.outcome === 'ok') done.add(r.id);
        return results;
      },
      async heartbeat(items: readonly HeartbeatItem[]) {
        await heartbeatReply.promise; // a slow round trip
        return items.map((i) => ({
          id: i.id,
          outcome: done.has(i.id) ? ('lost' as const) : ('ok' as const),
          leaseUntil: done.has(i.id) ? null : new Date(),
        }));
      },
    });
    const lost: unknown[] = [];
    const completed: unknown[] = [];
    const { logger, lines: warnings } = capturingLogger('warn');
    let extension: Promise<void> | null = null;
    const consumer = new QueueConsumer(
      engineDeps(store, clock, {
        logger,
        listeners: [{ lostOwnership: (e) => lost.push(e), completed: (e) => completed.push(e) }],
      }),
      queueOptions({ minReaders: 1, maxReaders: 1 }),
      async (_payload: unknown, ctx: JobContext) => {
        // A keep-alive the handler started for a long step; the step finished first.
        extension = ctx.extendLease(60_000).catch(() => undefined);
      },
    );
    consumer.start();
    await clock.advance(100);
    expect(completed).toHaveLength(1);
    heartbeatReply.resolve();
    await extension;
    await clock.advance(10);
    expect(warnings.filter((w) => w.includes('aborting its handler'))).toEqual([]);
    expect(lost).toEqual([]);
    await stopOnFakeClock(consumer, clock);
  });
});
