import {
  SqlQueueCanceledError,
  SqlQueueJobTimeoutError,
  SqlQueueLeaseLostError,
  SqlQueueValidationError,
} from '../errors.js';
import { safeEmit } from '../events.js';
import { ThrottledErrorLog } from '../logger.js';
import type { ResolvedQueueOptions } from '../options.js';
import { withTimeout } from '../timeout.js';
import { MAX_PROGRESS_BYTES, type HeartbeatResult } from '../types.js';
import { INT_MAX } from '../validation.js';
import type { AckerDeps, JobAcker } from './job-acker.js';
import { abortJob, type HeldJob, type HeldJobs } from './held-jobs.js';

/** Progress reports of one queue's jobs are written at most this often (with a heartbeat). */
const PROGRESS_INTERVAL_MS = 1_000;

/**
 * A progress value as the JSON text stored: a finite number from 0 to 100, or a plain object or
 * array of at most MAX_PROGRESS_BYTES as JSON text.
 */
function progressText(queue: string, jobId: string, value: unknown): string {
  const where = `job ${jobId} in queue '${queue}': progress(value)`;
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value < 0 || value > 100) {
      throw new SqlQueueValidationError(`${where} takes a number from 0 to 100 or a JSON object, got ${String(value)}`);
    }
    return JSON.stringify(value);
  }
  if (value === null || typeof value !== 'object') {
    throw new SqlQueueValidationError(`${where} takes a number from 0 to 100 or a JSON object, got ${typeof value}`);
  }
  let text: string;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    throw new SqlQueueValidationError(`${where}: the value is not JSON (${(error as Error).message})`);
  }
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes > MAX_PROGRESS_BYTES) {
    throw new SqlQueueValidationError(`${where}: ${bytes} bytes of JSON, over the limit of ${MAX_PROGRESS_BYTES}`);
  }
  return text;
}

/**
 * Keeps the leases of the jobs this process holds: one batch heartbeat per tick for the leases a
 * third used up, `context.extendLease()`, and the local checks that never wait on the database
 * (maxDurationMs, a lease that could not be renewed before it ran out). A job found lost is
 * aborted; a job past maxDurationMs has its failure recorded and is aborted.
 */
export class LeaseKeeper {
  private readonly errors: ThrottledErrorLog;
  private heartbeatRunning = false;
  /** A progress write is waiting for its turn (at most one a second per queue, for every job in it). */
  private progressScheduled = false;
  private lastProgressWriteAt = -Infinity;

  constructor(
    private readonly deps: AckerDeps,
    private readonly options: ResolvedQueueOptions,
    private readonly jobs: HeldJobs,
    private readonly acker: JobAcker,
    /** Takes a job that has not started (and its batch) out of the prefetch buffer; false if it was not there. */
    private readonly dropBuffered: (held: HeldJob) => boolean,
  ) {
    this.errors = new ThrottledErrorLog(deps.logger, `renewing leases in queue '${options.queue}'`, () =>
      deps.clock.now(),
    );
  }

  /** How often renew() runs: a sixth of the lease, between 20 ms and 5 s. */
  get intervalMs(): number {
    return Math.max(20, Math.min(Math.floor(this.options.leaseMs / 6), 5_000));
  }

  /**
   * Every tick: enforces maxDurationMs and aborts handlers whose lease could not be confirmed
   * before it ran out (these checks never wait on the database), then sends one batch
   * heartbeat for the held jobs whose lease is a third used up, unless one is still in flight.
   */
  async renew(now: number): Promise<void> {
    const due: HeldJob[] = [];
    const progressDue = now - this.lastProgressWriteAt >= PROGRESS_INTERVAL_MS;
    for (const held of this.jobs.values()) {
      if (held.lost || held.timedOut || held.committing) continue;
      const maxDuration = this.options.maxDurationMs;
      if (maxDuration !== null && now - held.claimedAtLocal >= maxDuration && this.jobs.running.has(held)) {
        this.timeOut(held, maxDuration);
        continue;
      }
      // Its renewal would only wait for the transaction that holds the only session (PGlite).
      if (held.holdsSession) continue;
      if (now >= held.localLeaseUntil) {
        // Could not renew in time (database unreachable): another worker may own it by now.
        abortJob(
          held,
          new SqlQueueLeaseLostError(held.job.queue, held.job.id, 'the lease could not be renewed before it expired'),
        );
        if (this.dropBuffered(held)) continue;
      }
      if (now - held.renewedAtLocal >= held.leaseMs / 3 || (progressDue && held.pendingProgress !== null))
        due.push(held);
    }
    if (this.heartbeatRunning || due.length === 0) return;
    this.heartbeatRunning = true;
    try {
      const requestedAt = this.deps.clock.now();
      const sentProgress = new Map(due.map((held) => [held, held.pendingProgress]));
      if (due.some((held) => held.pendingProgress !== null)) this.lastProgressWriteAt = requestedAt;
      const results = await this.boundedHeartbeat(due);
      this.errors.succeeded();
      const byId = new Map(results.map((r) => [r.id, r]));
      for (const held of due) {
        const result = byId.get(held.job.id);
        if (result?.outcome === 'ok') {
          held.renewedAtLocal = requestedAt;
          held.localLeaseUntil = requestedAt + held.leaseMs;
          // Written, unless the handler reported again while it was on its way.
          if (held.pendingProgress === sentProgress.get(held)) held.pendingProgress = null;
          if (result.cancel) this.cancel(held, result.cancel.reason);
        } else if (
          !held.canceled &&
          this.jobs.holds(held) &&
          (this.jobs.running.has(held) || held.startedAtLocal === null)
        ) {
          // (A canceled job's token is voided by its own cancellation: no loss to report.)
          // Only a job still running or waiting (buffered, or later in a group batch) can lose
          // its lease here. Once its handler has returned, its outcome is in flight, and that
          // token-checked write ('ok', 'already' or 'lost') decides and reports, not a renewal
          // racing it.
          this.markLost(held);
        }
      }
    } catch (error) {
      this.errors.failed(error, Math.floor(this.options.leaseMs / 6));
    } finally {
      this.heartbeatRunning = false;
      // A report that came while this heartbeat was on its way (the renew it scheduled found one
      // running and sent nothing) waits for its own turn, not for the next lease tick.
      if (!this.progressScheduled && [...this.jobs.values()].some((held) => held.pendingProgress !== null)) {
        this.scheduleProgressWrite();
      }
    }
  }

  /** `context.extendLease(ms)`: renews this job's lease now, for at least `ms` from now. */
  async extend(held: HeldJob, ms?: number): Promise<void> {
    if (ms !== undefined && (typeof ms !== 'number' || !Number.isInteger(ms) || ms < 1 || ms > INT_MAX)) {
      throw new SqlQueueValidationError(
        `job ${held.job.id} in queue '${held.job.queue}': extendLease(ms) takes an integer from 1 to ${INT_MAX}, got ${String(ms)}`,
      );
    }
    if (held.lost) throw new SqlQueueLeaseLostError(held.job.queue, held.job.id);
    // Never shortens: later routine heartbeats keep the longer lease, so the extension holds.
    held.leaseMs = Math.max(held.leaseMs, ms ?? 0);
    const requestedAt = this.deps.clock.now();
    const [result] = await this.boundedHeartbeat([held]);
    if (!result || result.outcome === 'lost') {
      // Once the handler has returned, its token-checked outcome decides and reports, as in renew().
      if (this.jobs.running.has(held)) this.markLost(held);
      throw new SqlQueueLeaseLostError(held.job.queue, held.job.id);
    }
    held.renewedAtLocal = requestedAt;
    held.localLeaseUntil = requestedAt + held.leaseMs;
    if (result.cancel) {
      this.cancel(held, result.cancel.reason);
      throw new SqlQueueCanceledError(held.job.queue, held.job.id, result.cancel.reason);
    }
  }

  /**
   * `context.progress(value)`: validated and kept; the next heartbeat writes it, and one is sent
   * for it no sooner than PROGRESS_INTERVAL_MS after the last progress write (so a handler that
   * reports a thousand times a second costs one statement a second); the completion writes the
   * last report a heartbeat did not. Never waits: the handler goes on at once.
   */
  reportProgress(held: HeldJob, value: unknown): void {
    held.pendingProgress = progressText(held.job.queue, held.job.id, value);
    safeEmit(this.deps.listeners, 'progress', { queue: held.job.queue, jobId: held.job.id, progress: value });
    this.scheduleProgressWrite();
  }

  /** One renew() for pending progress, PROGRESS_INTERVAL_MS after the last progress write. */
  private scheduleProgressWrite(): void {
    if (this.progressScheduled) return;
    this.progressScheduled = true;
    const waitMs = Math.max(0, this.lastProgressWriteAt + PROGRESS_INTERVAL_MS - this.deps.clock.now());
    void this.deps.clock
      .sleep(waitMs)
      .then(() => {
        this.progressScheduled = false;
        return this.renew(this.deps.clock.now());
      })
      .catch(() => undefined);
  }

  /**
   * A wake-up said a job of this queue may have been canceled (cancel() in some process): the
   * next renew() heartbeats every held job at once, instead of when its lease is a third used.
   */
  renewAllSoon(): void {
    for (const held of this.jobs.values()) held.renewedAtLocal = -Infinity;
  }

  /** One heartbeat statement, bounded so a dead connection cannot hold the lease keeper. */
  private boundedHeartbeat(helds: readonly HeldJob[]): Promise<HeartbeatResult[]> {
    return withTimeout(
      this.deps.store.heartbeat(
        helds.map((held) => ({
          id: held.job.id,
          claimToken: held.job.claimToken,
          leaseMs: held.leaseMs,
          maxDurationMs: this.options.maxDurationMs,
          progress: held.pendingProgress,
        })),
      ),
      Math.max(1_000, Math.floor(this.options.leaseMs / 3)),
      `renewing leases in queue '${this.options.queue}'`,
    );
  }

  private markLost(held: HeldJob): void {
    if (held.lost) return;
    held.lost = true;
    const error = new SqlQueueLeaseLostError(held.job.queue, held.job.id);
    this.deps.logger.warn(`${error.message}; aborting its handler`);
    safeEmit(this.deps.listeners, 'lostOwnership', {
      queue: held.job.queue,
      jobId: held.job.id,
      during: 'heartbeat',
      outcome: 'lost',
    });
    abortJob(held, error);
    if (!this.dropBuffered(held) && !this.jobs.running.has(held)) this.jobs.forget(held);
  }

  /**
   * cancel() reached a job this process holds: its handler's signal aborts with a
   * SqlQueueCanceledError, a job still in the prefetch buffer never starts, and the cancellation
   * is recorded (token-checked), after which the owner can no longer complete the job.
   */
  private cancel(held: HeldJob, reason: string | null): void {
    if (held.canceled || held.lost || held.timedOut) return;
    held.canceled = true;
    const error = new SqlQueueCanceledError(held.job.queue, held.job.id, reason);
    abortJob(held, error);
    // A later job of a running group batch is recorded by its reader when it gets there (its
    // cancellation gives back the jobs after it, which must not include the one running now).
    if (this.dropBuffered(held) || held.startedAtLocal !== null) this.acker.cancel(held, error);
  }

  /** maxDurationMs passed: record the failure now (token-checked) and abort the handler. */
  private timeOut(held: HeldJob, maxDurationMs: number): void {
    held.timedOut = true;
    const error = new SqlQueueJobTimeoutError(held.job.queue, held.job.id, maxDurationMs);
    this.deps.logger.warn(`${error.message}; aborting its handler and recording the attempt as failed`);
    abortJob(held, error);
    this.acker.fail(held, error, this.options.retryDelay(held.job.attempt, error), false);
  }
}
