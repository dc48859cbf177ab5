import type { ScheduleTick } from '../schedules/index.js';
import type { JobId } from '../types.js';

/** What a handler knows about the job it runs. */
export interface JobContext {
  jobId: JobId;
  queue: string;
  /** 1 for the first run. Lease expiries count as attempts too. */
  attempt: number;
  maxAttempts: number;
  /** The business id given at enqueue; pass it to receivers that deduplicate. */
  idempotencyKey: string | null;
  groupKey: string | null;
  /** The recurring schedule and tick that enqueued this job; null for any other job. */
  schedule: ScheduleTick | null;
  enqueuedAt: Date;
  claimedAt: Date;
  /**
   * Aborts when the job must stop: its lease was lost, it ran past `maxDurationMs`, or the
   * application is shutting down. `signal.reason` is the matching SqlQueue error.
   */
  signal: AbortSignal;
  /**
   * Renews the lease now, for a handler about to enter a long step: to `ms` from now (an
   * integer; default the queue's `leaseMs`), and later heartbeats keep that longer lease. It
   * never shortens the lease, and `maxDurationMs` still bounds it. Rejects with
   * SqlQueueLeaseLostError if the job is no longer this worker's.
   */
  extendLease(ms?: number): Promise<void>;
  /**
   * Reports how far the job is: a number from 0 to 100, or a small JSON object or array (at most
   * 4 KiB as text). Returns at once: the value is written with the job's heartbeats, at most once
   * a second, the last one always by the completion; `getJob()` and the dashboard show it.
   * Throws SqlQueueValidationError for any other value.
   */
  progress(value: number | object): void;
  /**
   * Postpones the job: whatever the handler then returns or throws, the job goes back to waiting
   * for `ms` (an integer, 0 to 2^31 − 1), without counting an attempt, as when it throws
   * `new SqlQueueRateLimitedError(ms)`. For a handler that met an outside limit (an HTTP 429).
   * Throws SqlQueueValidationError for any other value. The last call wins.
   */
  rateLimited(ms: number): void;
  /**
   * With the queue option `transactional`: the transaction this attempt runs in, on the queue's
   * database (PostgreSQL: a `pg` client in a transaction; PGlite: a transaction; SQL Server: an
   * `mssql` Transaction). Write through it, and enqueue follow-up jobs with `{ transaction }`:
   * when the handler returns, the job's completion is recorded in it and it commits, all or
   * nothing; when the handler throws, it rolls back. Do not commit or roll it back yourself.
   * Null for a queue without the option.
   */
  transaction: unknown;
}

/**
 * A job handler as the engine sees it; the Nest layer adapts `@QueueHandler` classes to it. What
 * it resolves with (a JSON value; undefined for none) is stored as the job's result.
 */
export type JobHandler = (payload: unknown, context: JobContext) => Promise<unknown>;
