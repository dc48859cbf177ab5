/**
 * Failure drills 2 and 7 (seed 000, issue 4): a worker frozen (SIGSTOP) past its lease while
 * another takes its job, then resumed (SIGCONT). Every write it then attempts with its old
 * claim token — heartbeat, completion, failure — must be refused by the database, and the
 * job must stay exactly as the new owner left it. Workers forward engine events over IPC, so
 * each refusal is observed as the worker reports it (lostOwnership, with `during`).
 */
import { expect, it } from 'vitest';
import { attemptSummary, enqueueKeys } from '../../helpers/drills.js';
import { waitFor } from '../../helpers/wait-for.js';
import type { WorkerProcess } from '../../helpers/worker-process.js';
import { SHORT_LEASE_MS, useDrillSchema, type DrillTarget } from './harness.js';

export function frozenDrills(target: DrillTarget): void {
  const { store, worker, proxy, row, jobDone, effectWritesOf, expectEachEffectOnce } = useDrillSchema(target, 'frozen');

  /** How the worker reported the outcome of its handler: accepted ('completed'/'failed') or refused. */
  function outcomeReported(worker: WorkerProcess, jobId: string) {
    return worker.next(
      (m) =>
        m.type === 'event' &&
        m.jobId === jobId &&
        (m.name === 'completed' || m.name === 'failed' || (m.name === 'lostOwnership' && m.during !== 'heartbeat')),
      10_000,
    );
  }

  it('drill 2 — frozen beyond the lease: the old owner’s heartbeat, completion and failure are all refused', async () => {
    const queue = 'frozen';
    const keys = ['frozen-then-completes', 'frozen-then-fails'];
    const [completing, failing] = (await enqueueKeys(store, queue, keys)) as [string, string];
    const a = await worker(queue, 'drill2-A', {
      mode: 'gated',
      leaseMs: SHORT_LEASE_MS,
      minReaders: 2,
      maxReaders: 2,
    });
    await Promise.all([completing, failing].map((id) => a.next((m) => m.type === 'started' && m.jobId === id)));
    a.kill('SIGSTOP');

    // While A sleeps, its leases run out; B takes both jobs and completes them.
    const b = await worker(queue, 'drill2-B', { maxReaders: 2 });
    await jobDone(completing, 'B to complete the first job');
    await jobDone(failing, 'B to complete the second job');
    const settled = [await row(completing), await row(failing)];
    for (const r of settled) expect(r).toMatchObject({ state: 'done', attempts: 2, worker_id: 'drill2-B' });

    a.kill('SIGCONT');
    // A wakes up believing it holds two leases: its first heartbeat finds both gone.
    for (const id of [completing, failing]) {
      await a.event('lostOwnership', (m) => m.jobId === id && m.during === 'heartbeat' && m.outcome === 'lost', 10_000);
    }
    // Its handlers go on regardless (they ignore the abort) and report their outcomes: both refused.
    a.release(completing, 'complete');
    a.release(failing, 'fail');
    expect(await outcomeReported(a, completing)).toMatchObject({
      name: 'lostOwnership',
      during: 'complete',
      outcome: 'lost',
    });
    expect(await outcomeReported(a, failing)).toMatchObject({ name: 'lostOwnership', during: 'fail', outcome: 'lost' });
    expect(a.received('event', 'completed')).toEqual([]);
    expect(a.received('event', 'failed')).toEqual([]);
    // Logged as refusals too (stderr is a separate pipe from IPC: the lines may trail the events).
    await waitFor(
      () => a.log,
      (log) =>
        log.includes(`job ${completing} in queue 'frozen': completion refused, this worker lost ownership`) &&
        log.includes(`job ${failing} in queue 'frozen': failure refused, this worker lost ownership`),
      { timeoutMs: 5_000, what: 'the worker to log both refusals' },
    );

    // The jobs are exactly as B left them: state, token, worker, times, no error recorded.
    expect([await row(completing), await row(failing)]).toEqual(settled);
    for (const id of [completing, failing]) {
      expect(attemptSummary(await store.getAttempts(id))).toEqual(['1:lease-expired:drill2-A', '2:completed:drill2-B']);
    }
    // A's late completion did try its business effect: the receiver kept B's.
    expect(await effectWritesOf(keys[0]!)).toEqual([
      { pid: b.pid, applied: true },
      { pid: a.pid, applied: false },
    ]);
    expect(await effectWritesOf(keys[1]!)).toEqual([{ pid: b.pid, applied: true }]);
  });

  it('drill 7 — heartbeat fencing: an old process cannot extend a lease that now belongs to another', async () => {
    const queue = 'fencing';
    const [id] = (await enqueueKeys(store, queue, ['fencing-1'])) as [string];
    const wire = await proxy();
    const a = await worker(queue, 'drill7-A', { mode: 'gated', leaseMs: SHORT_LEASE_MS, url: wire.url });
    await a.next((m) => m.type === 'started' && m.jobId === id);
    const claimed = await row(id);
    // Control: while A owns the job, its heartbeats do extend the lease.
    await waitFor(
      () => row(id),
      (r) => (r.lease_until as Date) > (claimed.lease_until as Date),
      { timeoutMs: 10_000, what: "A's heartbeat to extend its own lease" },
    );
    a.kill('SIGSTOP');

    // B claims after A's lease ran out, with a long lease, and is frozen too, so nothing renews
    // the lease legitimately while A tries: any change to the row would be A's doing.
    const b = await worker(queue, 'drill7-B', { mode: 'gated', leaseMs: 30_000 });
    await b.next((m) => m.type === 'started' && m.jobId === id, 20_000);
    b.kill('SIGSTOP');
    const owned = await row(id);
    expect(owned).toMatchObject({ state: 'leased', attempts: 2, worker_id: 'drill7-B' });

    const resumedAt = Date.now();
    a.kill('SIGCONT');
    await a.event('lostOwnership', (m) => m.jobId === id && m.during === 'heartbeat' && m.outcome === 'lost', 10_000);
    // The refusal came from the database: A's renewal, with A's token, reached it and changed no row.
    expect(wire.count('heartbeat', resumedAt)).toBeGreaterThanOrEqual(1);
    expect(await row(id)).toEqual(owned);

    // B still owns the job and finishes it; A's completion is then refused as well.
    b.kill('SIGCONT');
    b.release(id, 'complete');
    await b.next((m) => m.type === 'finished' && m.jobId === id);
    await jobDone(id, 'B to complete the job');
    a.release(id, 'complete');
    expect(await outcomeReported(a, id)).toMatchObject({ name: 'lostOwnership', during: 'complete', outcome: 'lost' });
    expect(await row(id)).toMatchObject({ state: 'done', worker_id: 'drill7-B', claim_token: owned.claim_token });
    expect(attemptSummary(await store.getAttempts(id))).toEqual(['1:lease-expired:drill7-A', '2:completed:drill7-B']);
  });

  it('drill 4 — every job of the drills above is done and each idempotency key has exactly one business effect', () =>
    expectEachEffectOnce({ repeatsExpected: true }));
}
