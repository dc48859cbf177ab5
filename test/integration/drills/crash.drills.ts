/**
 * Failure drills 1 and 4 (seed 000, issue 4): a worker process killed with SIGKILL right after
 * its claim committed, and one killed after its business effect but before its completion.
 * Real Nest workers in child processes against the target's database; workers report over IPC
 * when a handler started (its claim committed) and when it wrote its effect, so the test picks
 * its moment from those messages, never from a guessed sleep.
 */
import { expect, it } from 'vitest';
import { attemptSummary, enqueueKeys } from '../../helpers/drills.js';
import { REAPER_MS, SHORT_LEASE_MS, useDrillSchema, type DrillTarget } from './harness.js';

export function crashDrills(target: DrillTarget): void {
  const { store, worker, jobDone, runsOf, effectWritesOf, effectsOf, expectEachEffectOnce } = useDrillSchema(
    target,
    'crash',
  );

  it('drill 1 — crash after claim: the job comes back through the reaper and completes on another worker', async () => {
    const queue = 'crash-after-claim';
    const [id] = await enqueueKeys(store, queue, ['crash-after-claim-1']);
    const a = await worker(queue, 'drill1-A', { mode: 'hang', leaseMs: SHORT_LEASE_MS });
    await a.next((m) => m.type === 'started' && m.jobId === id);
    // 'started' is sent after the claim committed: the process dies holding a lease.
    a.kill('SIGKILL');
    await a.exited;
    const orphan = await store.getJob(id!);
    expect(orphan).toMatchObject({ state: 'leased', attempts: 1, workerId: 'drill1-A' });

    const b = await worker(queue, 'drill1-B');
    const bReadyAt = Date.now();
    const done = await jobDone(id!, 'the job to complete on worker B');
    expect(done!.workerId).toBe('drill1-B');
    const attempts = await store.getAttempts(id!);
    expect(attemptSummary(attempts)).toEqual(['1:lease-expired:drill1-A', '2:completed:drill1-B']);

    // Returned only once its lease had run out (the lease is the fence), and promptly after that.
    const leaseUntil = orphan!.leaseUntil!.getTime();
    const reapedAt = attempts[0]!.finishedAt.getTime();
    expect(reapedAt).toBeGreaterThanOrEqual(leaseUntil);
    expect(reapedAt - Math.max(leaseUntil, bReadyAt)).toBeLessThan(REAPER_MS + 2_000);

    expect(await runsOf(id!)).toEqual([
      { pid: a.pid, attempt: 1 },
      { pid: b.pid, attempt: 2 },
    ]);
    expect(await effectWritesOf('crash-after-claim-1')).toEqual([{ pid: b.pid, applied: true }]);
  });

  it('drill 4 — crash after the business effect but before the completion: the re-run is refused by the idempotent receiver', async () => {
    const queue = 'crash-after-effect';
    const key = 'crash-after-effect-1';
    const [id] = await enqueueKeys(store, queue, [key]);
    const a = await worker(queue, 'drill4-A', { mode: 'hang-after-effect', leaseMs: SHORT_LEASE_MS });
    const first = await a.next((m) => m.type === 'effected' && m.jobId === id);
    expect(first.applied).toBe(true);
    // The external action happened; the completion never will.
    a.kill('SIGKILL');
    await a.exited;

    const b = await worker(queue, 'drill4-B');
    const repeat = await b.next((m) => m.type === 'effected' && m.jobId === id, 20_000);
    expect(repeat.applied).toBe(false);
    await jobDone(id!, 'the job to complete on worker B');
    expect(attemptSummary(await store.getAttempts(id!))).toEqual(['1:lease-expired:drill4-A', '2:completed:drill4-B']);
    // The handler ran twice and tried the effect twice; the receiver applied it once.
    expect(await effectWritesOf(key)).toEqual([
      { pid: a.pid, applied: true },
      { pid: b.pid, applied: false },
    ]);
    expect(await effectsOf(key)).toEqual([{ pid: a.pid }]);
  });

  it('drill 4 — every job of the drills above is done and each idempotency key has exactly one business effect', () =>
    expectEachEffectOnce({ repeatsExpected: true }));
}
