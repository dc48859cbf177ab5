import type { SqlQueueCanceledError } from '../errors.js';
import type { Clock } from '../clock.js';
import { safeEmit, type QueueEventListener } from '../events.js';
import { ThrottledErrorLog, type QueueLogger } from '../logger.js';
import type { ResolvedQueueOptions } from '../options.js';
import type { QueueStore } from '../queue-store.js';
import { settleWithin, withTimeout } from '../timeout.js';
import type { HeldJob } from './held-jobs.js';

interface Pending {
  held: HeldJob;
  /** After this (engine clock), stop retrying: the lease has run out and the job will run again. */
  giveUpAt: number;
  /** Sent before, and the statement failed: its reply may have been lost after it committed. */
  retried?: boolean;
  /** A completion's result, as JSON text. */
  result?: string | null;
  /** A give-back that waits this long first (a rate-limited handler's postponement). */
  delayMs?: number;
}

interface PendingFailure extends Pending {
  error: unknown;
  delayMs: number;
  dead: boolean;
  /** An acknowledged cancellation: recorded as canceled, never retried. */
  canceled?: boolean;
}

export interface AckerDeps {
  store: QueueStore;
  clock: Clock;
  logger: QueueLogger;
  listeners: readonly QueueEventListener[];
  workerId: string;
}

const MAX_BATCH = 500;
const RETRY_MIN_MS = 50;
const RETRY_MAX_MS = 2_000;
const ERROR_TEXT_LIMIT = 8_000;
const STACK_TEXT_LIMIT = 16_000;

/**
 * Records outcomes in batches: whatever completions and failures arrive while one statement
 * is in flight go together in the next, so throughput is not capped by one round trip per
 * job. Every item is still checked on its own token. A statement that fails on a connection
 * error is retried (a lost reply is answered 'already' on retry); once the lease must have
 * run out the item is dropped, and the job comes back through the reaper.
 */
export class JobAcker {
  private completes: Pending[] = [];
  private failures: PendingFailure[] = [];
  private releases: Pending[] = [];
  private flushing: Promise<void> | null = null;
  private retryDelayMs = RETRY_MIN_MS;
  private readonly errors: ThrottledErrorLog;
  /** Set when drain() gives up: nothing more is sent, and nothing is retried after shutdown. */
  private readonly closed = new AbortController();

  constructor(
    private readonly deps: AckerDeps,
    private readonly options: ResolvedQueueOptions,
    /** The job's outcome is recorded (or given up); `completed`: it was a completion the database took. */
    private readonly onSettled: (held: HeldJob, completed: boolean) => void,
  ) {
    this.errors = new ThrottledErrorLog(deps.logger, `recording job outcomes in queue '${options.queue}'`, () =>
      deps.clock.now(),
    );
  }

  /** `result`: the handler's return value as JSON text, stored with the completion (null: none). */
  complete(held: HeldJob, result: string | null = null): void {
    this.completes.push({ held, giveUpAt: this.giveUpAt(), result });
    this.schedule();
  }

  fail(held: HeldJob, error: unknown, delayMs: number, dead: boolean): void {
    this.failures.push({ held, giveUpAt: this.giveUpAt(), error, delayMs, dead });
    this.schedule();
  }

  /** cancel() reached a held job: its attempt is recorded as canceled (token-checked), with the failures. */
  cancel(held: HeldJob, error: SqlQueueCanceledError): void {
    this.failures.push({ held, giveUpAt: this.giveUpAt(), error, delayMs: 0, dead: false, canceled: true });
    this.schedule();
  }

  /** A rate-limited handler's job goes back to waiting for `delayMs`, its attempt given back. */
  postpone(held: HeldJob, delayMs: number): void {
    this.releases.push({ held, giveUpAt: this.giveUpAt(), delayMs });
    this.schedule();
  }

  release(helds: readonly HeldJob[]): void {
    if (helds.length === 0) return;
    for (const held of helds) this.releases.push({ held, giveUpAt: this.giveUpAt() });
    this.schedule();
  }

  /** A transactional handler's completion, committed with its transaction: counted as a recorded completion. */
  completedInTransaction(held: HeldJob): void {
    this.reportCompleted(held, this.deps.clock.now());
    this.onSettled(held, true);
  }

  /** A transactional handler's completion the token check refused: its transaction rolled back. */
  lostInTransaction(held: HeldJob): void {
    this.reportLost(held, 'complete');
    this.onSettled(held, false);
  }

  get pending(): number {
    return this.completes.length + this.failures.length + this.releases.length;
  }

  /** Waits until every outcome is recorded or given up; bounded by `timeoutMs`. */
  async drain(timeoutMs = 10_000): Promise<void> {
    const deadline = this.deps.clock.now() + timeoutMs;
    while ((this.pending > 0 || this.flushing) && this.deps.clock.now() < deadline) {
      // A flush stuck on a dead connection must not hold shutdown past its deadline.
      if (this.flushing) await settleWithin(this.flushing, deadline - this.deps.clock.now());
      else await this.deps.clock.sleep(RETRY_MIN_MS);
    }
    this.closed.abort();
    const left = [...this.completes, ...this.failures, ...this.releases];
    if (left.length > 0) {
      this.deps.logger.warn(
        `queue '${this.options.queue}': ${left.length} job outcome(s) not recorded before shutdown (database unreachable?); those jobs will run again after their lease expires`,
      );
      this.completes = [];
      this.failures = [];
      this.releases = [];
      for (const item of left) this.onSettled(item.held, false);
    }
  }

  private giveUpAt(): number {
    return this.deps.clock.now() + 2 * this.options.leaseMs;
  }

  /**
   * Each outcome statement is bounded: one that hangs on a dead connection counts as failed and
   * is retried (the token check and the 'already' answer make a repeat harmless), instead of
   * stopping all outcome recording for the queue.
   */
  private bounded<T>(work: Promise<T>, what: string): Promise<T> {
    const ms = Math.min(Math.max(this.options.leaseMs / 2, 2_000), 30_000);
    return withTimeout(work, ms, `${what} in queue '${this.options.queue}'`);
  }

  private schedule(): void {
    if (this.flushing || this.closed.signal.aborted) return;
    this.flushing = this.flushLoop().finally(() => {
      this.flushing = null;
      if (this.pending > 0) this.schedule();
    });
  }

  private async flushLoop(): Promise<void> {
    // Let outcomes produced in the same turn of the event loop join this statement.
    await new Promise<void>((resolve) => setImmediate(resolve));
    while (this.pending > 0 && !this.closed.signal.aborted) {
      // Failures first: a job failed on timeout may also report a late success, which must
      // meet the voided token (and be refused), not win a race against its own failure. But
      // the completions of earlier jobs of a failing job's group batch go before it: the failure
      // gives back the batch's jobs still leased, which would include them.
      const failures = this.failures.splice(0, MAX_BATCH);
      const earlierOk = await this.flushCompletes(this.takeBatchCompletionsBefore(failures));
      if (!earlierOk) this.failures.unshift(...failures);
      const failuresOk = earlierOk && (await this.flushFailures(failures));
      const releasesOk = await this.flushReleases(this.releases.splice(0, MAX_BATCH));
      const completesOk = failuresOk && (await this.flushCompletes(this.completes.splice(0, MAX_BATCH)));
      if (failuresOk && releasesOk && completesOk) {
        this.retryDelayMs = RETRY_MIN_MS;
        this.errors.succeeded();
      } else {
        await this.deps.clock.sleep(this.retryDelayMs, this.closed.signal);
        this.retryDelayMs = Math.min(RETRY_MAX_MS, this.retryDelayMs * 2);
      }
    }
  }

  /**
   * Takes out of the pending completions those of jobs that ran before a failing job of the
   * same ordered group batch (same group key and claim token), so they are recorded first.
   */
  private takeBatchCompletionsBefore(failures: readonly PendingFailure[]): Pending[] {
    const failing = new Set(
      failures.filter(({ held }) => held.job.groupKey !== null).map(({ held }) => held.job.claimToken),
    );
    if (failing.size === 0 || this.completes.length === 0) return [];
    const failingIds = new Set(failures.map(({ held }) => held.job.id));
    const earlier: Pending[] = [];
    const rest: Pending[] = [];
    for (const item of this.completes) {
      const { job } = item.held;
      const before = job.groupKey !== null && failing.has(job.claimToken) && !failingIds.has(job.id);
      (before ? earlier : rest).push(item);
    }
    this.completes = rest;
    return earlier;
  }

  private async flushCompletes(items: Pending[]): Promise<boolean> {
    if (items.length === 0) return true;
    const results = await this.send(items, this.completes, 'recording completions', () =>
      this.deps.store.complete(
        // A progress report not written by a heartbeat yet goes with the completion: the last one is never lost.
        items.map(({ held, result }) => ({
          id: held.job.id,
          claimToken: held.job.claimToken,
          result: result ?? null,
          progress: held.pendingProgress,
        })),
      ),
    );
    if (!results) return false;
    const outcomes = new Map(results.map((r) => [r.id, r.outcome]));
    const now = this.deps.clock.now();
    for (const { held } of items) {
      const { job } = held;
      const outcome = outcomes.get(job.id) ?? 'lost';
      if (outcome === 'lost') this.reportLost(held, 'complete');
      else this.reportCompleted(held, now);
      this.onSettled(held, outcome !== 'lost');
    }
    return true;
  }

  private async flushFailures(items: PendingFailure[]): Promise<boolean> {
    if (items.length === 0) return true;
    const results = await this.send(items, this.failures, 'recording failures', () =>
      this.deps.store.fail(
        items.map(({ held, error, delayMs, dead, canceled }) => ({
          id: held.job.id,
          claimToken: held.job.claimToken,
          error: truncate(errorMessage(error), ERROR_TEXT_LIMIT),
          // A cancellation is the operator's doing: no stack of ours says anything about it.
          stack: !canceled && error instanceof Error && error.stack ? truncate(error.stack, STACK_TEXT_LIMIT) : null,
          retryDelayMs: delayMs,
          dead,
          workerId: this.deps.workerId,
          ...(canceled ? { canceled: true } : {}),
        })),
      ),
    );
    if (!results) return false;
    const byId = new Map(results.map((r) => [r.id, r]));
    for (const item of items) {
      const { job } = item.held;
      const result = byId.get(job.id);
      if (!result || result.outcome === 'lost') {
        this.reportLost(item.held, 'fail');
      } else if (item.canceled || result.state === 'canceled') {
        // A failure of a job cancel() had marked ends it canceled too (its owner had not heard yet).
        const reason = item.canceled ? (item.error as SqlQueueCanceledError).reason : null;
        this.deps.logger.warn(
          `job ${job.id} in queue '${job.queue}' canceled at attempt ${job.attempt}${reason ? `: ${reason}` : ''}`,
        );
        safeEmit(this.deps.listeners, 'canceled', { queue: job.queue, jobId: job.id, reason });
      } else {
        // 'already': the first try committed and its reply was lost. The state it set follows
        // from the same rule the statement applies.
        const dead = result.state ? result.state === 'dead' : item.dead || job.attempt >= job.maxAttempts;
        const message = errorMessage(item.error);
        if (dead) {
          this.deps.logger.error(
            `job ${job.id} in queue '${job.queue}' is dead after attempt ${job.attempt}/${job.maxAttempts}: ${message}`,
          );
        } else {
          this.deps.logger.warn(
            `job ${job.id} in queue '${job.queue}' failed (attempt ${job.attempt}/${job.maxAttempts}): ${message}; retrying in ${item.delayMs} ms`,
          );
        }
        safeEmit(this.deps.listeners, 'failed', {
          queue: job.queue,
          jobId: job.id,
          attempt: job.attempt,
          dead,
          error: message,
        });
      }
      this.onSettled(item.held, false);
    }
    return true;
  }

  private async flushReleases(items: Pending[]): Promise<boolean> {
    if (items.length === 0) return true;
    const results = await this.send(items, this.releases, 'giving back jobs', () =>
      this.deps.store.release(
        items.map(({ held, delayMs }) => ({
          id: held.job.id,
          claimToken: held.job.claimToken,
          ...(delayMs === undefined ? {} : { delayMs }),
        })),
      ),
    );
    if (!results) return false;
    const outcomes = new Map(results.map((r) => [r.id, r.outcome]));
    for (const { held, retried, delayMs } of items) {
      // A give-back has no 'already' answer: after a failed try, 'lost' most likely means the
      // first try committed. Either way the job is not this worker's, so nothing is counted.
      const outcome = outcomes.get(held.job.id) ?? 'lost';
      if (outcome === 'lost' && !retried) this.reportLost(held, 'release');
      if (outcome !== 'lost' && delayMs !== undefined) {
        safeEmit(this.deps.listeners, 'rateLimited', { queue: held.job.queue, jobId: held.job.id, delayMs });
      }
      this.onSettled(held, false);
    }
    return true;
  }

  /** One bounded outcome statement; on failure the items go back to their queue (or are given up). */
  private async send<T extends Pending, R>(
    items: T[],
    queue: T[],
    what: string,
    statement: () => Promise<R>,
  ): Promise<R | null> {
    try {
      return await this.bounded(statement(), what);
    } catch (error) {
      this.requeue(queue, items, error);
      return null;
    }
  }

  private requeue<T extends Pending>(queue: T[], items: T[], error: unknown): void {
    if (this.closed.signal.aborted) {
      // drain() already reported these as unrecorded; their leases bring the jobs back.
      for (const item of items) this.onSettled(item.held, false);
      return;
    }
    this.errors.failed(error, this.retryDelayMs);
    const now = this.deps.clock.now();
    const keep = items.filter((item) => item.giveUpAt > now);
    for (const item of keep) item.retried = true;
    for (const item of items) {
      if (item.giveUpAt > now) continue;
      this.deps.logger.error(
        `job ${item.held.job.id} in queue '${item.held.job.queue}': giving up recording its outcome; its lease has expired, so it will run again`,
      );
      this.onSettled(item.held, false);
    }
    queue.unshift(...keep);
  }

  private reportCompleted(held: HeldJob, now: number): void {
    const { job } = held;
    safeEmit(this.deps.listeners, 'completed', {
      queue: job.queue,
      jobId: job.id,
      attempt: job.attempt,
      enqueueToDoneMs: Math.max(0, now - job.enqueuedAt.getTime()),
      claimToDoneMs: Math.max(0, now - held.claimedAtLocal),
    });
  }

  private reportLost(held: HeldJob, during: 'complete' | 'fail' | 'release'): void {
    const { job } = held;
    const what = { complete: 'completion', fail: 'failure', release: 'give-back' }[during];
    this.deps.logger.warn(
      `job ${job.id} in queue '${job.queue}': ${what} refused, this worker lost ownership (lease expired or job re-claimed); the result is not counted`,
    );
    safeEmit(this.deps.listeners, 'lostOwnership', { queue: job.queue, jobId: job.id, during, outcome: 'lost' });
  }
}

function errorMessage(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  if (typeof error === 'string') return error;
  try {
    return JSON.stringify(error) ?? String(error);
  } catch {
    return String(error);
  }
}

/** Bounded, and without U+0000, which PostgreSQL text cannot hold (a whole batch would be refused). */
function truncate(text: string, limit: number): string {
  const bounded = text.length > limit ? `${text.slice(0, limit)}…` : text;
  return bounded.includes('\u0000') ? bounded.replaceAll('\u0000', '\uFFFD') : bounded;
}
