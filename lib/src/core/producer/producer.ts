import { EnqueueBatcher, type EnqueueBatchingSettings } from './enqueue-batcher.js';
import { SqlQueueValidationError, SqlQueueWaitTimeoutError } from '../errors.js';
import type { QueueStore } from '../queue-store.js';
import { NO_TRACING, type QueueTracer } from '../tracing.js';
import type {
  AttemptRecord,
  BlockedGroupPage,
  CancelResult,
  DeadJobPage,
  EnqueueOptions,
  EnqueueResult,
  FlowUsage,
  JobId,
  JobRecord,
  NewJob,
  QueuePause,
  QueueStats,
} from '../types.js';
import {
  assertInteger,
  assertKeyText,
  assertOptionGroup,
  assertQueueName,
  assertReason,
  describe,
  MAX_AGE_MS,
} from '../validation.js';
import { ENQUEUE_OPTION_KEYS, prepareJob, withTraceContext } from './job-validation.js';
import { ASK_AGAIN_MS, type FinishWatch } from './finish-watch.js';
import { cancelWakeName, type RemoteWaker, type WakeBus } from '../wake.js';

/** waitFor's polling: from 25 ms doubling to 1 s, or 5 s once consumers elsewhere answer its asks. */
const WAIT_POLL_MIN_MS = 25;
const WAIT_POLL_MAX_MS = 1_000;
const WAIT_POLL_MAX_LIVE_MS = 5_000;
/** The states a job ends in. */
const FINISHED: ReadonlySet<JobRecord['state']> = new Set(['done', 'dead', 'canceled']);

/** Most job ids one cancelMany takes (one statement). */
const MAX_CANCEL_IDS = 1_000;

/** Options of one enqueue call. */
export interface EnqueueCallOptions extends EnqueueOptions {
  /**
   * The caller's open transaction (an mssql `Transaction`, a pg client after `BEGIN`, or a
   * PGlite transaction): the job commits or rolls back with the caller's own writes.
   */
  transaction?: unknown;
}

/** One job of a bulk enqueue. */
export interface EnqueueItem<T = unknown> extends EnqueueOptions {
  payload: T;
}

export interface ProducerSettings {
  maxPayloadBytes: number;
  /** Max attempts for jobs of a queue when the enqueue call does not say. */
  maxAttemptsFor(queue: string): number;
  /** Concurrent single enqueues outside a caller's transaction share statements (off when absent). */
  enqueueBatching?: EnqueueBatchingSettings & { enabled: boolean };
  /** Producer spans, and the trace context each job stores (none when absent). */
  tracer?: QueueTracer;
  /** Wakes waitFor() when its job finishes (polling only when absent). */
  finishWatch?: FinishWatch;
}

const CALL_OPTION_KEYS: readonly string[] = [...ENQUEUE_OPTION_KEYS, 'transaction'];
const ITEM_KEYS: readonly string[] = ['payload', ...ENQUEUE_OPTION_KEYS];

/** Jobs per statement in a bulk enqueue; larger calls are split (each part atomic). */
export const ENQUEUE_CHUNK = 10_000;
const JOB_ID = /^[1-9]\d{0,18}$/;
/** Ids are bigint in both dialects: 19 digits can still exceed it. */
const BIGINT_MAX = 9_223_372_036_854_775_807n;

/**
 * The framework-free producer: validates everything before any SQL runs, enqueues in one
 * round trip per call (single enqueues outside a transaction share it with concurrent ones),
 * and wakes readers (here at once, elsewhere through the store).
 */
export class QueueProducerCore {
  private readonly batcher: EnqueueBatcher | null;
  private readonly tracer: QueueTracer;

  constructor(
    private readonly store: QueueStore,
    private readonly settings: ProducerSettings,
    private readonly wakeBus: WakeBus,
    private readonly remoteWaker: RemoteWaker | null,
  ) {
    const batching = settings.enqueueBatching;
    this.batcher = batching?.enabled ? new EnqueueBatcher(store, batching, (queue) => this.wake(queue)) : null;
    this.tracer = settings.tracer ?? NO_TRACING;
  }

  async enqueue<T>(queue: string, payload: T, options: EnqueueCallOptions = {}): Promise<EnqueueResult> {
    const { transaction, ...jobOptions } = assertOptionGroup(
      `enqueue to '${String(queue)}' options`,
      options,
      CALL_OPTION_KEYS,
      SqlQueueValidationError,
    );
    const job = this.prepare(queue, payload, jobOptions);
    // Validated first: a send span stands for a job that went to the database.
    return this.tracer.send(queue, null, async (traceContext) => {
      withTraceContext([job], traceContext);
      // A caller's transaction is its own connection and commit: never shared with other calls.
      if (transaction === undefined && this.batcher) return this.batcher.enqueue(job);
      const [result] = await this.store.enqueue([job], transaction);
      // Inside the caller's transaction the job is invisible until the caller commits: a wake-up
      // now would only cost every reader an empty claim. The caller wakes after commit (wake()).
      if (result!.created && transaction === undefined) this.wake(queue);
      return result!;
    });
  }

  /**
   * Enqueues many jobs of one queue, in one statement per 10,000 jobs, results in input order.
   * Every item is validated first: one bad item fails the call before anything is written.
   */
  async enqueueMany<T>(
    queue: string,
    items: readonly EnqueueItem<T>[],
    options: { transaction?: unknown } = {},
  ): Promise<EnqueueResult[]> {
    assertQueueName(queue);
    if (!Array.isArray(items)) {
      throw new SqlQueueValidationError(`enqueueMany to '${queue}': items must be an array, got ${describe(items)}`);
    }
    const { transaction } = assertOptionGroup(
      `enqueueMany to '${queue}' options`,
      options,
      ['transaction'],
      SqlQueueValidationError,
    );
    const jobs = items.map((item, index) => {
      if (!item || typeof item !== 'object' || !('payload' in item)) {
        throw new SqlQueueValidationError(
          `enqueueMany to '${queue}' (item ${index}): expected { payload, ...options }`,
        );
      }
      // A transaction belongs to the call, not to one item: listed as unknown here.
      const { payload, ...jobOptions } = assertOptionGroup(
        `enqueueMany to '${queue}' (item ${index})`,
        item,
        ITEM_KEYS,
        SqlQueueValidationError,
      );
      return this.prepare(queue, payload, jobOptions, `item ${index}`);
    });
    if (jobs.length === 0) return [];
    // One send span for the call; every job carries its context, so each job's handler joins it.
    return this.tracer.send(queue, jobs.length, async (traceContext) => {
      withTraceContext(jobs, traceContext);
      const results: EnqueueResult[] = [];
      for (let start = 0; start < jobs.length; start += ENQUEUE_CHUNK) {
        results.push(...(await this.store.enqueue(jobs.slice(start, start + ENQUEUE_CHUNK), transaction)));
      }
      if (transaction === undefined && results.some((r) => r.created)) this.wake(queue);
      return results;
    });
  }

  /**
   * Sends the single enqueues still waiting for a statement, for at most `timeoutMs`, and
   * refuses later ones (they fail with SqlQueueClosedError). Called before the store closes.
   */
  async close(timeoutMs: number): Promise<void> {
    await this.batcher?.close(timeoutMs);
  }

  /** Nudges readers of a queue, here and in other processes (e.g. after committing a transaction). */
  wake(queue: string): void {
    this.wakeBus.wake(queue);
    this.remoteWaker?.request(queue);
  }

  async getJob(jobId: JobId): Promise<JobRecord | null> {
    return this.store.getJob(assertJobId(jobId));
  }

  async getAttempts(jobId: JobId): Promise<AttemptRecord[]> {
    return this.store.getAttempts(assertJobId(jobId));
  }

  async stats(queue: string): Promise<QueueStats> {
    return this.store.stats(assertQueueName(queue));
  }

  async listDead(queue: string, page: { limit?: number; afterId?: JobId | null } = {}): Promise<DeadJobPage> {
    assertQueueName(queue);
    const limit = assertInteger('listDead limit', page.limit ?? 50, 1, 1000, SqlQueueValidationError);
    const afterId = page.afterId === undefined || page.afterId === null ? null : assertJobId(page.afterId);
    return this.store.listDead(queue, { limit, afterId });
  }

  /** Dead jobs back to ready with a fresh attempt budget: the given ids, or all of the queue. */
  async retryDead(queue: string, jobIds: readonly JobId[] | 'all'): Promise<JobId[]> {
    assertQueueName(queue);
    const ids = jobIds === 'all' ? 'all' : assertIdList(jobIds);
    const retried = await this.store.retryDead(queue, ids);
    if (retried.length > 0) this.wake(queue);
    return retried;
  }

  /** Deletes dead jobs of a queue: all, those dead longer than `olderThanMs`, or the given `ids`. */
  async purgeDead(queue: string, options: { olderThanMs?: number; ids?: readonly JobId[] } = {}): Promise<number> {
    assertQueueName(queue);
    if (options.ids !== undefined && options.olderThanMs !== undefined) {
      throw new SqlQueueValidationError('purgeDead takes ids or olderThanMs, not both');
    }
    const olderThanMs =
      options.olderThanMs === undefined
        ? 0
        : assertInteger('purgeDead olderThanMs', options.olderThanMs, 0, MAX_AGE_MS, SqlQueueValidationError);
    const purged = await this.store.purgeDead(
      queue,
      options.ids === undefined ? { olderThanMs } : { ids: assertIdList(options.ids) },
    );
    // A purged job may have blocked an ordered group, whose next job can run now.
    if (purged > 0) this.wake(queue);
    return purged;
  }

  /**
   * Pauses a queue on every instance: stored in the database, so it holds across restarts and
   * for instances that boot later. No claim leases a job of it until resumeQueue; running jobs
   * finish; enqueue still works. True when this call paused it, false when it was paused already.
   */
  async pauseQueue(queue: string, options: { reason?: string } = {}): Promise<boolean> {
    assertQueueName(queue);
    const { reason } = assertOptionGroup('pauseQueue options', options, ['reason'], SqlQueueValidationError);
    return this.store.pauseQueue(queue, assertReason(`pauseQueue('${queue}')`, reason));
  }

  /** Ends a queue's pause and wakes its readers; true when it was paused. */
  async resumeQueue(queue: string): Promise<boolean> {
    assertQueueName(queue);
    const resumed = await this.store.resumeQueue(queue);
    if (resumed) this.wake(queue);
    return resumed;
  }

  /**
   * Cancels jobs by id (see CancelOutcome): ready and delayed ones at once; leased ones through
   * their owner, told by its next heartbeat, or at once by a wake-up where one reaches it.
   */
  async cancelMany(jobIds: readonly JobId[], options: { reason?: string } = {}): Promise<CancelResult[]> {
    const ids = assertIdList(jobIds);
    if (ids.length > MAX_CANCEL_IDS) {
      throw new SqlQueueValidationError(`cancelMany takes at most ${MAX_CANCEL_IDS} job ids, got ${ids.length}`);
    }
    const { reason } = assertOptionGroup('cancel options', options, ['reason'], SqlQueueValidationError);
    const results = await this.store.cancel(ids, assertReason('cancel', reason));
    for (const queue of new Set(results.filter((r) => r.outcome === 'canceling').map((r) => r.queue!))) {
      this.wake(cancelWakeName(queue));
    }
    const canceled = results.filter((r) => r.outcome === 'canceled');
    // A canceled job that headed an ordered group let the group's next job go.
    for (const queue of new Set(canceled.map((r) => r.queue!))) this.wake(queue);
    // No consumer hears of these: their waiters are told from here.
    for (const { id } of canceled) this.settings.finishWatch?.finished(id, { announce: true });
    return results;
  }

  /** cancelMany for one job. */
  async cancel(jobId: JobId, options: { reason?: string } = {}): Promise<CancelResult> {
    const [result] = await this.cancelMany([assertJobId(jobId)], options);
    return result!;
  }

  /** Cancels the job with this idempotency key in the queue; null when no job of the queue has it. */
  async cancelByKey(
    queue: string,
    idempotencyKey: string,
    options: { reason?: string } = {},
  ): Promise<CancelResult | null> {
    assertQueueName(queue);
    const key = assertKeyText(`cancelByKey('${queue}')`, 'idempotencyKey', idempotencyKey);
    assertOptionGroup('cancel options', options, ['reason'], SqlQueueValidationError);
    const id = await this.store.findJobByKey(queue, key);
    return id === null ? null : this.cancel(id, options);
  }

  /**
   * Waits until a job is finished (done, dead or canceled) and resolves with its record, whose
   * `result` is what the handler returned. Woken when the job finishes in this process, or in
   * another where wake-ups reach every process (PostgreSQL NOTIFY); it also polls getJob() (one
   * primary-key read), from 25 ms doubling to 1 s (5 s while wake-ups reach it). Rejects with
   * SqlQueueWaitTimeoutError after `timeoutMs` (default 30 s), and with a SqlQueueValidationError
   * when the job does not exist.
   */
  async waitFor(jobId: JobId, options: { timeoutMs?: number } = {}): Promise<JobRecord> {
    const id = assertJobId(jobId);
    const { timeoutMs } = assertOptionGroup('waitFor options', options, ['timeoutMs'], SqlQueueValidationError);
    const limitMs = assertInteger('waitFor timeoutMs', timeoutMs ?? 30_000, 1, MAX_AGE_MS, SqlQueueValidationError);
    const deadline = Date.now() + limitMs;
    const first = await this.readForWait(id);
    if (FINISHED.has(first.state)) return first;
    let signaled: boolean;
    let wakeUp: (() => void) | null = null;
    const watcher = this.settings.finishWatch?.watch(id, () => {
      signaled = true;
      wakeUp?.();
    });
    try {
      let askedAt = Date.now();
      for (
        let pauseMs = WAIT_POLL_MIN_MS;
        ;
        pauseMs = Math.min(pauseMs * 2, watcher?.live ? WAIT_POLL_MAX_LIVE_MS : WAIT_POLL_MAX_MS)
      ) {
        // Read at once after watching (the job may have finished meanwhile) and whenever woken.
        signaled = false;
        const job = await this.readForWait(id);
        if (FINISHED.has(job.state)) return job;
        const left = deadline - Date.now();
        if (left <= 0) {
          throw new SqlQueueWaitTimeoutError(
            `waitFor: job ${id} in queue '${job.queue}' is still ${job.state} after ${limitMs} ms`,
          );
        }
        if (Date.now() - askedAt >= ASK_AGAIN_MS) {
          watcher?.askAgain();
          askedAt = Date.now();
        }
        if (signaled) continue;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, Math.min(pauseMs, left));
          wakeUp = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wakeUp = null;
      }
    } finally {
      watcher?.stop();
    }
  }

  private async readForWait(id: JobId): Promise<JobRecord> {
    const job = await this.store.getJob(id);
    if (job === null) {
      throw new SqlQueueValidationError(`waitFor: no job ${id} (it never existed, or it finished and was cleaned up)`);
    }
    return job;
  }

  /** Every paused queue, with its reason and when it was paused. */
  async listPausedQueues(): Promise<QueuePause[]> {
    return this.store.listPausedQueues();
  }

  /** Ordered groups stopped by a dead job (`groupOnDead: 'block'`), by group key, `limit` (default 50) per page. */
  async listBlockedGroups(
    queue: string,
    page: { limit?: number; afterKey?: string | null } = {},
  ): Promise<BlockedGroupPage> {
    assertQueueName(queue);
    const limit = assertInteger('listBlockedGroups limit', page.limit ?? 50, 1, 1000, SqlQueueValidationError);
    const afterKey = page.afterKey ?? null;
    if (afterKey !== null && typeof afterKey !== 'string') {
      throw new SqlQueueValidationError(`listBlockedGroups afterKey must be a string, got ${describe(afterKey)}`);
    }
    return this.store.listBlockedGroups(queue, { limit, afterKey });
  }

  /**
   * A queue's flow limits and what they hold back now: running jobs, starts in the rate window,
   * keys at their limit, and the `top` (default 10, at most 100) busiest keys. Without flow
   * control (SQL Server in this release) it reports no limits and no keys.
   */
  async flowUsage(queue: string, options: { top?: number } = {}): Promise<FlowUsage> {
    assertQueueName(queue);
    const top = assertInteger('flowUsage top', options.top ?? 10, 1, 100, SqlQueueValidationError);
    if (this.store.flowUsage) return this.store.flowUsage(queue, top);
    const stats = await this.store.stats(queue);
    return { queue, limits: null, running: stats.leased, windowStarts: null, keysAtLimit: null, keys: [] };
  }

  private prepare(queue: string, payload: unknown, options: EnqueueOptions, where?: string): NewJob {
    assertQueueName(queue);
    return prepareJob(
      queue,
      payload,
      options,
      { maxPayloadBytes: this.settings.maxPayloadBytes, defaultMaxAttempts: this.settings.maxAttemptsFor(queue) },
      where,
    );
  }
}

export function assertJobId(jobId: unknown): JobId {
  if (typeof jobId !== 'string' || !JOB_ID.test(jobId) || BigInt(jobId) > BIGINT_MAX) {
    throw new SqlQueueValidationError(`job id ${describe(jobId)} is invalid: ids are decimal strings such as '42'`);
  }
  return jobId;
}

function assertIdList(ids: unknown): JobId[] {
  if (!Array.isArray(ids)) {
    throw new SqlQueueValidationError(`job ids must be an array of decimal strings or 'all', got ${describe(ids)}`);
  }
  return ids.map(assertJobId);
}
