import { expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 3 };
const db = migratedPgStore('hbcap', 2);

it('a heartbeat past maxDurationMs does not report "ok" while moving a valid lease into the past', async () => {
  await db.store.enqueue([prepareJob('q', {}, {}, LIMITS)]);
  const [claimed] = await db.store.claim({ queue: 'q', limit: 1, leaseMs: 60_000, workerId: 'w' });
  const maxDurationMs = 200;
  // Wait (on the database clock, via the job's own claimed_at) until the cap has passed.
  await waitFor(
    async () =>
      (await db.store.stats('q')).leased === 1 && Date.now() - claimed!.claimedAt.getTime() > maxDurationMs + 100,
    Boolean,
    { what: 'maxDurationMs to pass' },
  );
  const [hb] = await db.store.heartbeat([
    { id: claimed!.id, claimToken: claimed!.claimToken, leaseMs: 60_000, maxDurationMs },
  ]);
  // Either the heartbeat says the job can no longer be held, or the lease it reports is still valid.
  const reapedNow = await db.store.reap(10);
  expect({ outcome: hb!.outcome, reapedRightAfterOk: reapedNow.some((r) => r.id === claimed!.id) }).not.toEqual({
    outcome: 'ok',
    reapedRightAfterOk: true,
  });
});
