import type { OwnershipOutcome } from './types.js';

/**
 * What the engine reports as it runs, for metrics and tests. Every callback is optional and
 * must not throw (a throwing listener is caught and ignored).
 */
export interface QueueEventListener {
  claimed?(event: { queue: string; count: number; limit: number; durationMs: number }): void;
  emptyClaim?(event: { queue: string }): void;
  completed?(event: {
    queue: string;
    jobId: string;
    attempt: number;
    /** Enqueue to completion, on the engine clock against the database's created time. */
    enqueueToDoneMs: number;
    claimToDoneMs: number;
  }): void;
  failed?(event: { queue: string; jobId: string; attempt: number; dead: boolean; error: string }): void;
  lostOwnership?(event: {
    queue: string;
    jobId: string;
    during: 'heartbeat' | 'complete' | 'fail' | 'release';
    outcome: OwnershipOutcome;
  }): void;
  readersChanged?(event: { queue: string; readers: number; reason: 'start' | 'activation' | 'retire' | 'stop' }): void;
  abandoned?(event: { queue: string; jobId: string }): void;
  /** A handler reported progress (`context.progress()`); written to the database at most once a second. */
  progress?(event: { queue: string; jobId: string; progress: unknown }): void;
  /**
   * A handler met an outside limit (SqlQueueRateLimitedError, `context.rateLimited()`): its job
   * was given back to wait `delayMs`, the attempt not counted.
   */
  rateLimited?(event: { queue: string; jobId: string; delayMs: number }): void;
  /** A job this process held was canceled (cancel()): its handler was aborted and the cancellation recorded. */
  canceled?(event: { queue: string; jobId: string; reason: string | null }): void;
  /**
   * The repair sweep found an ordered group whose cached state disagreed with its jobs, and
   * fixed it. Normal operation never causes one: each is worth a look.
   */
  groupRepaired?(event: { queue: string; groupKey: string; problem: string }): void;
  // Service Broker queues (SQL Server): `queue` is the broker queue's name (its `broker.queues`
  // key). Their handlers run as jobs of the table queue of that name, so `completed`, `failed`
  // and the rest report them as for any table queue.
  /**
   * A receiver's move committed: `received` messages taken from the Service Broker queue,
   * `moved` of them now jobs, `ended` conversations ended (EndDialog or Error received).
   */
  brokerMoved?(event: { queue: string; received: number; moved: number; ended: number }): void;
  /** Receivers of a broker queue (or the reader of an initiator queue) in this process changed. */
  brokerReceiversChanged?(event: {
    queue: string;
    receivers: number;
    reason: 'start' | 'activation' | 'poll' | 'retire' | 'stop';
  }): void;
  /** An activation started a receiver: a QUEUE_ACTIVATION notification, or the slow poll. */
  brokerActivated?(event: { queue: string; source: 'notification' | 'poll' }): void;
  /** The activation event notification of a queue was missing or broken; it was recreated (or could not be). */
  brokerNotificationLost?(event: { queue: string; problem: string; recreated: boolean }): void;
  /**
   * A due schedule was advanced, in the transaction that enqueued its jobs: `ticks` jobs
   * enqueued, `skipped` missed ticks not fired (catchUp), `lagMs` how far behind its first
   * unfired tick was (database time).
   */
  scheduleFired?(event: { id: string; queue: string; ticks: number; skipped: number; lagMs: number }): void;
}

export function safeEmit<K extends keyof QueueEventListener>(
  listeners: readonly QueueEventListener[],
  name: K,
  event: Parameters<NonNullable<QueueEventListener[K]>>[0],
): void {
  for (const listener of listeners) {
    try {
      const returned: unknown = (listener[name] as ((e: typeof event) => unknown) | undefined)?.(event);
      // An async listener's rejection must not become an unhandled rejection either.
      if (typeof (returned as PromiseLike<unknown> | undefined)?.then === 'function') {
        Promise.resolve(returned).catch(() => undefined);
      }
    } catch {
      // A metrics listener must never break job processing.
    }
  }
}
