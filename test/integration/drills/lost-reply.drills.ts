/**
 * Failure drill 3 (seed 000, issue 4): the completion commits but its reply never reaches the
 * worker. The worker talks to the database through a TCP proxy that the test controls: it lets
 * the completion statement through, withholds everything the server answers on that
 * connection, and cuts the connection once the server has finished (committed).
 */
import { expect, it } from 'vitest';
import { attemptSummary, enqueueKeys, within } from '../../helpers/drills.js';
import { waitFor } from '../../helpers/wait-for.js';
import { SHORT_LEASE_MS, useDrillSchema, type DrillTarget } from './harness.js';

export function lostReplyDrills(target: DrillTarget): void {
  const { store, worker, proxy, row, runsOf, effectWritesOf, clockPast, expectEachEffectOnce } = useDrillSchema(
    target,
    'lostreply',
  );

  it('drill 3 — lost completion reply: the completion commits, its reply never arrives; the worker retries, is told "already", runs nothing again', async () => {
    const queue = 'lost-reply';
    const key = 'lost-reply-1';
    const wire = await proxy();
    // A long lease, so no heartbeat is due while the reply is withheld (see the late-reply drill below).
    const a = await worker(queue, 'drill3-A', { leaseMs: 10_000, url: wire.url });
    const intercepted = wire.holdReplyAfter('complete');
    const [id] = (await enqueueKeys(store, queue, [key])) as [string];
    const held = await within(intercepted, 20_000, 'the worker to send its completion');
    await within(held.serverDone, 10_000, 'the server to finish the completion statement');
    // The server committed; the worker has heard nothing.
    expect(await row(id)).toMatchObject({ state: 'done', worker_id: 'drill3-A', attempts: 1 });
    expect(a.received('event', 'completed')).toEqual([]);
    held.cut();

    // The acker retries on a new connection; the same token on a done row answers 'already',
    // which the worker counts as its completion (a 'lost' answer would be a lostOwnership event).
    const outcome = await a.next(
      (m) => m.type === 'event' && m.jobId === id && /^(completed|lostOwnership)$/.test(String(m.name)),
      15_000,
    );
    expect(outcome).toMatchObject({ name: 'completed', attempt: 1 });
    expect(wire.count('complete')).toBeGreaterThanOrEqual(2);
    expect(a.received('event', 'lostOwnership')).toEqual([]);
    // Logged once when it failed and once when it recovered (stderr and IPC are separate
    // pipes: the lines may trail the event).
    const log = await waitFor(
      () => a.log,
      (text) => /recording job outcomes in queue 'lost-reply' recovered after \d+ s/.test(text),
      { what: 'the worker to log that recording outcomes recovered' },
    );
    expect(log).toMatch(/recording job outcomes in queue 'lost-reply' failed: .+; retrying in \d+ ms/);
    expect(await runsOf(id)).toEqual([{ pid: a.pid, attempt: 1 }]);
    expect(attemptSummary(await store.getAttempts(id))).toEqual(['1:completed:drill3-A']);
    expect(await effectWritesOf(key)).toEqual([{ pid: a.pid, applied: true }]);

    // The worker is healthy afterwards: the next job runs normally.
    const [next] = (await enqueueKeys(store, queue, ['lost-reply-2'])) as [string];
    await a.event('completed', (m) => m.jobId === next, 15_000);
  });

  it('drill 3 — lost completion reply and the worker dies before hearing back: the job stays done, nothing runs it again', async () => {
    const queue = 'lost-reply-kill';
    const key = 'lost-reply-kill-1';
    const wire = await proxy();
    const a = await worker(queue, 'drill3b-A', { leaseMs: SHORT_LEASE_MS, url: wire.url });
    const intercepted = wire.holdReplyAfter('complete');
    const [id] = (await enqueueKeys(store, queue, [key])) as [string];
    const held = await within(intercepted, 20_000, 'the worker to send its completion');
    await within(held.serverDone, 10_000, 'the server to finish the completion statement');
    // Killed between the commit and the acknowledgement.
    a.kill('SIGKILL');
    held.cut();
    await a.exited;
    const done = await row(id);
    expect(done).toMatchObject({ state: 'done', worker_id: 'drill3b-A', attempts: 1 });

    // Wait (on the database clock) until the lease A held would have run out, renewals included,
    // then run the reaper's own statement: a committed completion is final, nothing comes back.
    await waitFor(
      () => clockPast(done.claimed_at as Date, 2 * SHORT_LEASE_MS),
      (past) => past,
      { timeoutMs: 15_000, intervalMs: 100, what: "A's lease to have run out" },
    );
    const reaped = await store.reap(1_000);
    expect(reaped.map((r) => r.id)).not.toContain(id);
    expect(await row(id)).toEqual(done);
    expect(await runsOf(id)).toEqual([{ pid: a.pid, attempt: 1 }]);
    expect(attemptSummary(await store.getAttempts(id))).toEqual(['1:completed:drill3b-A']);
    expect(await effectWritesOf(key)).toEqual([{ pid: a.pid, applied: true }]);
  });

  it('drill 3 — a completion reply that is late past a heartbeat: the worker does not report losing the job it completed', async () => {
    // The heartbeat keeps renewing a job whose completion is in flight; once the completion has
    // committed, that renewal finds the row done (not leased) and answers "lost". The engine
    // must not report that as lost ownership: the completion's own outcome ('already') decides.
    const queue = 'late-reply';
    const wire = await proxy();
    const a = await worker(queue, 'drill3c-A', { leaseMs: SHORT_LEASE_MS, url: wire.url });
    const intercepted = wire.holdReplyAfter('complete');
    const [id] = (await enqueueKeys(store, queue, ['late-reply-1'])) as [string];
    const held = await within(intercepted, 20_000, 'the worker to send its completion');
    await within(held.serverDone, 10_000, 'the server to finish the completion statement');
    const committedAt = Date.now();
    // Hold the reply until a heartbeat has been due (a third of the lease) and sent, or surely would have been.
    await waitFor(
      () => wire.count('heartbeat', committedAt) > 0 || Date.now() - committedAt > SHORT_LEASE_MS,
      Boolean,
      {
        timeoutMs: 10_000,
        what: 'a heartbeat while the completion reply is withheld',
      },
    );
    held.cut();
    // The scenario needs a renewal sent after the completion committed (one queued behind the
    // held connection reaches the wire once it is cut): without it the test proves nothing.
    await waitFor(
      () => wire.count('heartbeat', committedAt),
      (n) => n > 0,
      { timeoutMs: 10_000, what: 'a heartbeat sent after the completion committed' },
    );
    await a.event('completed', (m) => m.jobId === id, 15_000);
    expect(await row(id)).toMatchObject({ state: 'done', worker_id: 'drill3c-A', attempts: 1 });
    expect(a.received('event', 'lostOwnership')).toEqual([]);
    expect(a.log).not.toContain('the lease was lost');
  });

  it('drill 4 — every job of the drills above is done and each idempotency key has exactly one business effect', () =>
    expectEachEffectOnce({ repeatsExpected: false }));
}
