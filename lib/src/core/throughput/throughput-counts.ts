import { SqlQueueValidationError } from '../errors.js';
import { THROUGHPUT_RETENTION_MS, type ThroughputCount } from '../types.js';
import { assertInteger, assertQueueName } from '../validation.js';

/** The longest window readThroughput serves: what retention keeps. */
export const THROUGHPUT_MAX_MINUTES = THROUGHPUT_RETENTION_MS / 60_000;

/**
 * What a store's recordThroughput sends: counts checked (queue names, non-negative integers),
 * one row per queue, rows without any outcome dropped. Both dialects take it as it is.
 */
export function sumThroughputByQueue(counts: readonly ThroughputCount[]): ThroughputCount[] {
  const sums = new Map<string, ThroughputCount>();
  for (const count of counts) {
    const queue = assertQueueName(count.queue);
    const sum = sums.get(queue) ?? { queue, completed: 0, failed: 0, dead: 0, busyMs: 0 };
    for (const field of ['completed', 'failed', 'dead', 'busyMs'] as const) {
      sum[field] =
        (sum[field] ?? 0) +
        assertInteger(`throughput ${field}`, count[field] ?? 0, 0, Number.MAX_SAFE_INTEGER, SqlQueueValidationError);
    }
    sums.set(queue, sum);
  }
  return [...sums.values()].filter((sum) => sum.completed + sum.failed + sum.dead > 0);
}

/** The readThroughput window, 1..THROUGHPUT_MAX_MINUTES. */
export function assertThroughputMinutes(minutes: unknown): number {
  return assertInteger('throughput minutes', minutes, 1, THROUGHPUT_MAX_MINUTES, SqlQueueValidationError);
}
