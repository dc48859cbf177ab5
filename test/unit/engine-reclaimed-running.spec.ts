import { describe, expect, it } from 'vitest';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import type { ClaimedJob } from '../../lib/src/core/types.js';
import { claimedJob, engineDeps, queueOptions, TokenStore, untilAborted } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { deferred } from '../helpers/wait-for.js';

function job(id: string, token: string, attempt: number): ClaimedJob {
  return claimedJob(id, token, { payload: { attempt }, attempt, leaseMs: 6_000 });
}

/**
 * Regression, found in review. Before the fix, job 7 loses its lease while its handler is still finishing
 * (within the abandon grace), the reaper puts it back and this same process claims it again (new token) on
 * another reader. `running` is keyed by job id, and run()'s `finally` deletes the key unconditionally: the
 * first execution's end removes the SECOND execution's entry. From then on the second run is invisible: no
 * maxDurationMs, no abort at shutdown (stop() hangs on a handler that would obey its signal), wrong `running`
 * figure.
 */

/**
 * Job 7 (token t1) is handed out by the first claim; run 1 ends only on `firstRunEnds.resolve()`
 * and ignores its signal, run 2 (attempt 2) obeys its signal. Two readers, a 6 s lease.
 */
function reclaimScenario(store: TokenStore) {
  const clock = new FakeClock();
  store.tokens.set('7', 't1');
  store.queued.push([job('7', 't1', 1)]);
  const firstRunEnds = deferred<void>();
  const state = { secondRunAborted: false };
  const handler = async (payload: unknown, ctx: JobContext) => {
    if ((payload as { attempt: number }).attempt === 1) {
      await firstRunEnds.promise; // a slow step that does not look at the signal
      return;
    }
    // The second run is a well-behaved handler: it stops as soon as its signal aborts.
    ctx.signal.addEventListener('abort', () => (state.secondRunAborted = true));
    await untilAborted(ctx.signal);
  };
  const consumer = new QueueConsumer(
    engineDeps(store, clock),
    queueOptions({ minReaders: 2, maxReaders: 2, leaseMs: 6_000, minPollMs: 50, maxPollMs: 100 }),
    handler,
  );
  return {
    clock,
    consumer,
    firstRunEnds,
    state,
    /** The lease is lost (reaped): the next heartbeat says so and aborts run 1 (grace 5 s). */
    async loseLease() {
      store.tokens.set('7', 't2');
      await clock.advance(2_100);
    },
    /** The reaper made it ready; this process claims it again, with the new token. */
    async claimAgain() {
      store.queued.push([job('7', 't2', 2)]);
      await clock.advance(200);
    },
  };
}

describe('the same job re-claimed while its previous run is finishing', () => {
  it('keeps tracking the new run after the old one ends', async () => {
    // Failures and give-backs are answered 'ok' whatever the token.
    const { clock, consumer, firstRunEnds, state, loseLease, claimAgain } = reclaimScenario(
      new TokenStore({ checkFailAndRelease: false }),
    );
    consumer.start();
    await clock.advance(100);
    expect(consumer.snapshot().running).toBe(1);

    await loseLease();
    await claimAgain();
    expect(consumer.snapshot().running).toBe(2); // run 1 (aborted, in its grace period) and run 2

    // Run 1 finishes within its grace period (its completion is refused: lost).
    firstRunEnds.resolve();
    await clock.advance(10);
    // Run 2 is still running.
    expect(state.secondRunAborted).toBe(false);
    expect(consumer.snapshot().running).toBe(1);
  });

  it('stop() aborts the re-claimed run instead of waiting for it forever', async () => {
    const { clock, consumer, firstRunEnds, loseLease, claimAgain } = reclaimScenario(new TokenStore());
    consumer.start();
    await clock.advance(100);
    await loseLease();
    await claimAgain();
    firstRunEnds.resolve();
    await clock.advance(10);

    let stopped = false;
    const stopping = consumer.stop(1_000).then(() => (stopped = true));
    await clock.advance(30_000);
    expect(stopped).toBe(true);
    await Promise.race([stopping, new Promise((r) => setTimeout(r, 100))]);
  });
});
