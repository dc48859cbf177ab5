/**
 * Every error the library throws on purpose is a `SqlQueueError`, so callers can tell our
 * refusals (bad input, lost ownership, schema mismatch) from driver and network failures.
 */
export class SqlQueueError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** An option passed to the module, a handler or a store is invalid. Raised at boot. */
export class SqlQueueConfigError extends SqlQueueError {}

/** An argument of an API call is invalid. Raised before any SQL runs. */
export class SqlQueueValidationError extends SqlQueueError {}

/**
 * The worker no longer owns the job: its claim token was replaced (lease expired and the job
 * was reaped or re-claimed) or the job left the leased state. The work it did must not be
 * reported as success; with a lease, "exactly once" holds only for the database row.
 */
export class SqlQueueLeaseLostError extends SqlQueueError {
  constructor(
    readonly queue: string,
    readonly jobId: string,
    detail = 'the lease was lost (expired, reaped or claimed by another worker)',
  ) {
    super(`job ${jobId} in queue '${queue}': ${detail}`);
  }
}

/** A handler ran longer than its `maxDurationMs`; the job was failed and its signal aborted. */
export class SqlQueueJobTimeoutError extends SqlQueueError {
  constructor(
    readonly queue: string,
    readonly jobId: string,
    readonly maxDurationMs: number,
  ) {
    super(`job ${jobId} in queue '${queue}' exceeded maxDurationMs=${maxDurationMs}`);
  }
}

/**
 * `cancel()` was called for a running job: its `context.signal` aborts with this error as the
 * reason. The attempt is recorded as canceled and the job is not retried, whatever the handler
 * then does; its owner can no longer complete it.
 */
export class SqlQueueCanceledError extends SqlQueueError {
  constructor(
    readonly queue: string,
    readonly jobId: string,
    readonly reason: string | null,
  ) {
    super(`job ${jobId} in queue '${queue}' was canceled${reason ? `: ${reason}` : ''}`);
  }
}

/**
 * Thrown by a handler that met an outside limit (an HTTP 429, a quota): the job goes back to
 * waiting for `retryAfterMs` (an integer from 0 to 2^31 − 1 ms, about 24.8 days), without
 * counting an attempt and without an attempt record. `context.rateLimited(ms)` does the same
 * without throwing. A job can be postponed this way any number of times.
 */
export class SqlQueueRateLimitedError extends SqlQueueError {
  readonly retryAfterMs: number;

  constructor(retryAfterMs: number, message?: string) {
    super(message ?? `rate limited: retry after ${retryAfterMs} ms`);
    this.retryAfterMs = assertRetryAfterMs(retryAfterMs);
  }
}

/** The bound of a postponement, as the database columns hold it (DelayMs is an int on SQL Server). */
export function assertRetryAfterMs(ms: unknown): number {
  if (typeof ms !== 'number' || !Number.isInteger(ms) || ms < 0 || ms > 2_147_483_647) {
    throw new SqlQueueValidationError(
      `retryAfterMs must be an integer from 0 to 2147483647 (ms), got ${typeof ms === 'number' ? ms : typeof ms}`,
    );
  }
  return ms;
}

/** `waitFor()` gave up: the job had not finished within its `timeoutMs` (it goes on running). */
export class SqlQueueWaitTimeoutError extends SqlQueueError {}

/** The application is shutting down; running handlers are asked to stop. */
export class SqlQueueShutdownError extends SqlQueueError {
  constructor() {
    super('the consumer is shutting down');
  }
}

/**
 * Thrown by a handler to say that retrying cannot help (bad payload, permanent refusal):
 * the job goes to the dead state at once, with this error kept.
 */
export class SqlQueueUnrecoverableError extends SqlQueueError {}

/** The database schema is missing, older or newer than this version of the library. */
export class SqlQueueSchemaError extends SqlQueueError {}

/** The claim was attempted inside an open transaction, where its locking contract does not hold. */
export class SqlQueueTransactionError extends SqlQueueError {}

/** The producer was closed (the application shut down): nothing more is enqueued through it. */
export class SqlQueueClosedError extends SqlQueueError {}
