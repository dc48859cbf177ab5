import { parseScheduleJobKey } from '../schedules/index.js';
import {
  assertRetryAfterMs,
  SqlQueueRateLimitedError,
  SqlQueueUnrecoverableError,
  type SqlQueueCanceledError,
} from '../errors.js';
import { safeEmit } from '../events.js';
import type { ResolvedQueueOptions } from '../options.js';
import type { QueueTracer } from '../tracing.js';
import type { MovingAverage } from './activation.js';
import type { JobContext, JobHandler } from './handler.js';
import { signalOf, type HeldJob, type HeldJobs } from './held-jobs.js';
import type { AckerDeps, JobAcker } from './job-acker.js';
import type { LeaseKeeper } from './lease-keeper.js';
import { MAX_RESULT_BYTES, type CompleteResult, type JobRecord } from '../types.js';
import type { HandlerTransaction } from '../queue-store.js';
import { withTimeout } from '../timeout.js';

/** How long after aborting a handler the reader keeps waiting for it before moving on. */
const ABANDON_GRACE_MS = 5_000;
export const SHUTDOWN_ABANDON_GRACE_MS = 1_000;

/**
 * How a job's run ended, for the batch it belongs to: `completed` (its completion is on its
 * way), `released` (given back unstarted or stopped by shutdown), `ended` (failed, timed out,
 * lost or abandoned: its batch siblings come back through the database, not from here).
 */
type RunOutcome = 'completed' | 'released' | 'ended';

/** What the runner asks of the consumer around it. */
export interface JobRunnerHost {
  stopping(): boolean;
  /** Resolves when shutdown begins: a group batch stops waiting for a completion then. */
  readonly stopped: Promise<'stopping'>;
}

/**
 * Runs a reader's unit of work: one job, or an ordered group's batch. Each attempt runs its
 * handler in a consumer span with the job's context, races it against abandonment once the job
 * is aborted, and hands the outcome to the acker: a completion, a failure with its retry delay
 * (dead at once for SqlQueueUnrecoverableError), or a give-back when shutdown stopped it.
 */
export class JobRunner {
  constructor(
    private readonly deps: AckerDeps,
    private readonly options: ResolvedQueueOptions,
    private readonly jobs: HeldJobs,
    private readonly acker: JobAcker,
    private readonly leases: LeaseKeeper,
    private readonly handler: JobHandler,
    private readonly tracer: QueueTracer,
    /** Handler run times, for `prefetch: 'auto'`. */
    private readonly handlerMs: MovingAverage,
    private readonly host: JobRunnerHost,
  ) {}

  /**
   * Runs one job, or an ordered group's batch in id order, each after the one before is done: its
   * completion recorded in the database, not only sent. So a crash never runs a group's job again
   * after its successor started (it would, had the successor started while the completion was
   * still on its way: the lost completion brings the job back, behind the successor's run). A
   * batch stops at the first job that does not complete: a failure's statement gives the rest
   * back in the database (as does a reaped or lost lease, or a completion refused as lost), so
   * they are only let go here; a job given back, or shutdown, gives the rest back with it.
   */
  async runBatch(batch: HeldJob[]): Promise<void> {
    for (const [index, held] of batch.entries()) {
      const followed = index + 1 < batch.length;
      const done = followed ? new Promise<boolean>((resolve) => (held.recorded = resolve)) : Promise.resolve(true);
      let outcome: RunOutcome;
      try {
        outcome = await this.run(held);
      } catch (error) {
        // A bug must not take the reader down or keep renewing a lease for nothing: the job
        // is let go, and its lease brings it back.
        this.deps.logger.error(
          `job ${held.job.id} in queue '${this.options.queue}': unexpected error after its handler ran; the job comes back when its lease expires: ${describeReason(error)}`,
          error instanceof Error ? error.stack : undefined,
        );
        this.jobs.forget(held);
        outcome = 'ended';
      }
      const rest = batch.slice(index + 1);
      if (rest.length === 0) return;
      // At shutdown the rest is given back below at once, whether the completion landed or not.
      if (outcome === 'completed' && (await Promise.race([done, this.host.stopped])) === false) outcome = 'ended';
      held.recorded = null;
      // A handler that blocked the event loop past the lease may return before any heartbeat
      // tick could notice: the batch's token may be void and its group taken by another reader.
      if (outcome === 'completed' && this.deps.clock.now() >= rest[0]!.localLeaseUntil) outcome = 'ended';
      // Heartbeats cannot extend a lease past claim + maxDurationMs, which counts from the
      // batch's claim: past half of it, the rest goes back for a fresh claim, as a prefetched
      // job that waited that long does (ClaimLoop.releaseStale).
      const maxDuration = this.options.maxDurationMs;
      const waitedTooLong = maxDuration !== null && this.deps.clock.now() - held.claimedAtLocal >= maxDuration / 2;
      if (outcome === 'completed' && !this.host.stopping() && !waitedTooLong) continue;
      if (outcome === 'ended') for (const follower of rest) this.jobs.forget(follower);
      else this.acker.release(rest);
      return;
    }
  }

  private async run(held: HeldJob): Promise<RunOutcome> {
    const { job } = held;
    if (held.aborted) return this.endUnstarted(held);
    // A transactional queue's attempt runs in a transaction opened before its handler: one that
    // cannot be opened (the pool exhausted, the database away) gives the job back unstarted.
    let transaction: HandlerTransaction | null = null;
    if (this.options.transactional) {
      try {
        transaction = await this.deps.store.beginHandlerTransaction!();
      } catch (error) {
        this.deps.logger.warn(
          `job ${job.id} in queue '${job.queue}': could not open its handler's transaction, giving it back unstarted: ${describeReason(error)}`,
        );
        this.acker.release([held]);
        return 'released';
      }
      // Shutdown, a cancellation or a lost lease may have come while it opened: the handler
      // would run outside what shutdown waits for, or for a job no longer its own.
      if (this.host.stopping() || held.aborted) {
        await transaction.rollback();
        if (held.aborted) return this.endUnstarted(held);
        this.acker.release([held]);
        return 'released';
      }
      held.holdsSession = this.deps.store.singleSession === true;
    }
    const context: JobContext = {
      jobId: job.id,
      queue: job.queue,
      attempt: job.attempt,
      maxAttempts: job.maxAttempts,
      idempotencyKey: job.idempotencyKey,
      groupKey: job.groupKey,
      schedule: parseScheduleJobKey(job.idempotencyKey),
      enqueuedAt: job.enqueuedAt,
      claimedAt: job.claimedAt,
      get signal() {
        return signalOf(held);
      },
      extendLease: (ms) => this.leases.extend(held, ms),
      progress: (value) => this.leases.reportProgress(held, value),
      rateLimited: (ms) => {
        held.postponeMs = assertRetryAfterMs(ms);
      },
      transaction: transaction?.handle ?? null,
    };
    const execution = this.execute(held, context, transaction);
    this.jobs.running.set(held, execution);
    try {
      return await execution;
    } finally {
      this.jobs.running.delete(held);
      held.committing = false;
      held.holdsSession = false;
    }
  }

  /**
   * A job aborted before its handler started (while it waited behind the jobs before it in its
   * group batch, or while its transaction opened): a cancellation is recorded now; a lease that
   * was lost or ran out lets it go.
   */
  private endUnstarted(held: HeldJob): RunOutcome {
    if (held.canceled) this.acker.cancel(held, held.abortReason as SqlQueueCanceledError);
    else this.jobs.forget(held);
    return 'ended';
  }

  /**
   * A transactional handler returned: its job's completion is recorded in its transaction, which
   * then commits. The token check refusing the completion (the lease was lost) rolls back the
   * handler's writes. A completion or commit that fails is a failure of the attempt (counted, so a
   * conflict that repeats forever, a deadlock on SQL Server or a serialization failure, ends dead
   * after maxAttempts instead of looping); a commit whose reply was lost is found out from the
   * job's row, never guessed.
   */
  private async commitInTransaction(
    held: HeldJob,
    transaction: HandlerTransaction,
    result: string | null,
  ): Promise<RunOutcome> {
    const { job } = held;
    const failAttempt = (error: unknown, what: string) => {
      const failure = new Error(`the handler's transaction did not commit (${what}): ${describeReason(error)}`, {
        cause: error,
      });
      this.acker.fail(held, failure, this.options.retryDelay(job.attempt, failure), false);
      return 'ended' as const;
    };
    let outcome: CompleteResult['outcome'];
    held.committing = true;
    try {
      ({ outcome } = await transaction.complete({
        id: job.id,
        claimToken: job.claimToken,
        result,
        progress: held.pendingProgress,
      }));
    } catch (error) {
      await transaction.rollback();
      return failAttempt(error, 'recording the completion failed');
    }
    if (outcome === 'lost') {
      await transaction.rollback();
      this.acker.lostInTransaction(held);
      return 'ended';
    }
    try {
      await transaction.commit();
    } catch (error) {
      // Committed or not: the job's row says which (its completion carries this attempt's token).
      // Bounded: the read waits for the failed commit's session, which a partitioned network can
      // keep open on the server for long.
      let row: JobRecord | null;
      try {
        row = await withTimeout(transaction.readBack(job.id), this.options.leaseMs, "reading the job's row back");
      } catch (readError) {
        this.deps.logger.warn(
          `job ${job.id} in queue '${job.queue}': its transaction's commit failed (${describeReason(error)}) and its outcome cannot be read (${describeReason(readError)}); the database decides: done if it committed, else it runs again after its lease`,
        );
        this.jobs.forget(held);
        return 'ended';
      }
      const ours = row !== null && row.claimToken === job.claimToken;
      if (ours && row!.state === 'done') {
        this.deps.logger.warn(
          `job ${job.id} in queue '${job.queue}': its transaction's commit reported ${describeReason(error)}, but it committed (its completion is in the database)`,
        );
        this.acker.completedInTransaction(held);
        return 'completed';
      }
      if (ours && row!.state === 'leased') return failAttempt(error, 'the commit failed');
      this.acker.lostInTransaction(held);
      return 'ended';
    }
    this.acker.completedInTransaction(held);
    return 'completed';
  }

  private async execute(
    held: HeldJob,
    context: JobContext,
    transaction: HandlerTransaction | null,
  ): Promise<RunOutcome> {
    const { job } = held;
    const startedAt = this.deps.clock.now();
    held.startedAtLocal = startedAt;
    // Each attempt is its own consumer span, in the trace of the enqueue that stored the job.
    const handled = Promise.resolve()
      .then(() => this.tracer.process(job, () => this.handler(job.payload, context)))
      .then(
        (value: unknown) => resultOf(job.queue, job.id, value),
        (error: unknown) => ({ ok: false, error }) as const,
      );
    // Race the handler against abandonment, which only starts once the job is aborted: a
    // handler that ignores its signal must not hold a reader forever.
    // Created only for an aborted job (most never are), and cancelled once the race settles.
    const grace: { timer?: AbortController } = {};
    const result = await new Promise<Awaited<typeof handled> | 'abandoned'>((resolve) => {
      void handled.then(resolve);
      const startGrace = () => {
        grace.timer = new AbortController();
        const ms = held.shutdownAborted ? SHUTDOWN_ABANDON_GRACE_MS : ABANDON_GRACE_MS;
        void this.deps.clock.sleep(ms, grace.timer.signal).then(() => resolve('abandoned'));
      };
      if (held.aborted) startGrace();
      else held.onAbort = startGrace;
    });
    grace.timer?.abort();
    held.onAbort = null;
    // Only a handler that returned, for a job still its own to complete, commits its transaction.
    const commits =
      transaction !== null &&
      result !== 'abandoned' &&
      result.ok &&
      !held.canceled &&
      !held.timedOut &&
      held.postponeMs === null;
    // An abandoned handler may still be using its transaction: its rollback is not waited for.
    if (transaction !== null && !commits) {
      if (result === 'abandoned') void transaction.rollback();
      else await transaction.rollback();
    }
    if (result === 'abandoned') {
      this.deps.logger.warn(
        `job ${job.id} in queue '${job.queue}': handler ignored its abort signal (${describeReason(held.abortReason)}); the reader moves on and the lease decides the job's fate`,
      );
      safeEmit(this.deps.listeners, 'abandoned', { queue: job.queue, jobId: job.id });
      this.jobs.forget(held);
      return 'ended';
    }
    const outcome = result;
    this.handlerMs.add(this.deps.clock.now() - startedAt);

    // Even when a heartbeat already found the lease gone, the outcome is sent: the token check
    // in the database is the arbiter, and its refusal is what gets logged and counted.
    // A canceled job's outcome is its cancellation, already on its way: a late success or failure
    // of its handler changes nothing (the token is void once the cancellation is recorded).
    if (held.canceled) return 'ended';
    // A handler that met an outside limit: back to waiting, its attempt given back (as a
    // give-back is), so the rest of its group batch goes back with it. Not after a timeout,
    // which was already recorded as this attempt's failure.
    const postponeMs =
      held.postponeMs ??
      (!outcome.ok && outcome.error instanceof SqlQueueRateLimitedError ? outcome.error.retryAfterMs : null);
    if (postponeMs !== null && !held.timedOut) {
      this.acker.postpone(held, postponeMs);
      return 'released';
    }
    // A transactional handler that returned after its timeout: its transaction rolled back above,
    // and the timeout is this attempt's recorded failure.
    if (outcome.ok && transaction !== null) {
      return commits ? this.commitInTransaction(held, transaction, outcome.result) : 'ended';
    }
    if (outcome.ok) {
      this.acker.complete(held, outcome.result);
      return held.lost ? 'ended' : 'completed';
    }
    if (held.timedOut) return 'ended'; // the timeout was already recorded as this attempt's failure (and forgotten)
    if (held.shutdownAborted && !held.lost) {
      // Stopped by shutdown, not by its own fault: give the job back without using an attempt.
      this.acker.release([held]);
      return 'released';
    }
    const error = outcome.error;
    const dead = error instanceof SqlQueueUnrecoverableError;
    this.acker.fail(held, error, dead ? 0 : this.options.retryDelay(job.attempt, error), dead);
    return 'ended';
  }
}

/**
 * A handler's return value as the JSON text stored with its completion (null for none). One
 * that is not JSON, or longer than MAX_RESULT_BYTES, fails the job for good (it would be the same
 * next time), with an error naming the limit: the result is refused, never silently dropped.
 */
function resultOf(
  queue: string,
  jobId: string,
  value: unknown,
): { ok: true; result: string | null } | { ok: false; error: unknown } {
  if (value === undefined || value === null) return { ok: true, result: null };
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    return {
      ok: false,
      error: new SqlQueueUnrecoverableError(
        `job ${jobId} in queue '${queue}': its result is not JSON: ${describeReason(error)}`,
      ),
    };
  }
  if (text === undefined) {
    return {
      ok: false,
      error: new SqlQueueUnrecoverableError(
        `job ${jobId} in queue '${queue}': its result (a ${typeof value}) is not JSON`,
      ),
    };
  }
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes > MAX_RESULT_BYTES) {
    return {
      ok: false,
      error: new SqlQueueUnrecoverableError(
        `job ${jobId} in queue '${queue}': its result is ${bytes} bytes of JSON, over the limit of ${MAX_RESULT_BYTES} (MAX_RESULT_BYTES); store large output elsewhere and return a reference`,
      ),
    };
  }
  return { ok: true, result: text };
}

function describeReason(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}
