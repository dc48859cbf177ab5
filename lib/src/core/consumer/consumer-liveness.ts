import type { ConsumerSnapshot } from './consumer.js';
import type { QueueConsumerSnapshot } from './queue-consumer.js';

/**
 * Floor of the default stall threshold. A healthy claim loop with an idle reader records
 * progress at least every `max(maxPollMs, 5 s error backoff)` plus one claim round trip, and
 * a claim against an unreachable database fails within the driver's connect timeout (10 s for
 * the pools this library opens, 15 s for mssql's defaults). One minute is several times that
 * worst normal gap, so a database outage alone never looks like a wedge.
 */
export const MIN_STALLED_AFTER_MS = 60_000;

/** Default stall threshold for a queue: the floor above, or three of its longest idle pauses. */
export function defaultStalledAfterMs(maxPollMs: number): number {
  return Math.max(MIN_STALLED_AFTER_MS, 3 * maxPollMs);
}

/** One queue's part of a liveness verdict. */
export interface QueueLiveness {
  queue: string;
  readers: number;
  /** Handlers running now. */
  running: number;
  /** Readers waiting for a job: only they need the claim loop to move. */
  idleReaders: number;
  buffered: number;
  /** Claims are failing (database unreachable, …): reported, but not a liveness failure. */
  claimFailing: boolean;
  stopping: boolean;
  /** Milliseconds since the claim loop last made progress. */
  sinceLastLoopMs: number;
  stalledAfterMs: number;
  wedged: boolean;
  /** Why the queue is wedged; null when it is not. */
  reason: string | null;
}

export interface ConsumerLiveness {
  live: boolean;
  running: boolean;
  /** The first reason the consumer is not live; null when it is. */
  reason: string | null;
  queues: QueueLiveness[];
}

/**
 * Decides whether a consumer is alive, from its snapshot alone: no database round trip, so a
 * database outage does not fail liveness (and restart every pod at once).
 *
 * A queue is wedged when, while it is not stopping:
 * - it has no reader at all (a running queue always keeps at least `minReaders` ≥ 1), or
 * - at least one reader is waiting for a job and nothing is buffered for it, yet the claim
 *   loop has not made progress (claimed, slept after an empty claim, or failed and backed
 *   off) for longer than `stalledAfterMs`.
 *
 * Readers that are all busy running handlers are not wedged, however long the handlers take:
 * handlers are bounded by `maxDurationMs` and abandoned after their abort signal is ignored,
 * and the claim loop rightly sleeps while nobody waits for a job.
 */
export function assessConsumerLiveness(
  snapshot: ConsumerSnapshot,
  now: number,
  stalledAfterMs: (queue: QueueConsumerSnapshot) => number,
): ConsumerLiveness {
  const queues = snapshot.queues.map((q): QueueLiveness => {
    const threshold = stalledAfterMs(q);
    const idleReaders = Math.max(0, q.readers - q.running);
    const sinceLastLoopMs = Math.max(0, now - q.lastLoopAt);
    let reason: string | null = null;
    if (!q.stopping && q.readers === 0) {
      reason = `queue '${q.queue}' has no reader running`;
    } else if (!q.stopping && idleReaders > 0 && q.buffered === 0 && sinceLastLoopMs > threshold) {
      reason = `queue '${q.queue}': the claim loop made no progress for ${Math.round(sinceLastLoopMs / 1000)} s (limit ${Math.round(threshold / 1000)} s) while ${idleReaders} reader(s) wait for work`;
    }
    return {
      queue: q.queue,
      readers: q.readers,
      running: q.running,
      idleReaders,
      buffered: q.buffered,
      claimFailing: q.claimFailing,
      stopping: q.stopping,
      sinceLastLoopMs,
      stalledAfterMs: threshold,
      wedged: reason !== null,
      reason,
    };
  });
  if (!snapshot.running) {
    return { live: false, running: false, reason: 'the queue consumer is not running', queues };
  }
  const wedged = queues.find((q) => q.wedged);
  return { live: !wedged, running: true, reason: wedged?.reason ?? null, queues };
}
