import type { ResolvedRetentionOptions } from '../options.js';
import type { QueueStore } from '../queue-store.js';
import { safeEmit, type QueueEventListener } from '../events.js';
import type { GroupRepair, ReapedJob } from '../types.js';

/**
 * Returns expired leases to ready (or dead), batch after batch, until a batch comes back
 * short or `maxBatches` ran. Safe on every instance at once: each batch skips rows another
 * reaper holds and re-checks expiry under its own lock.
 */
export async function reapExpiredLeases(store: QueueStore, batchSize: number, maxBatches = 20): Promise<ReapedJob[]> {
  const reaped: ReapedJob[] = [];
  for (let batch = 0; batch < maxBatches; batch++) {
    const jobs = await store.reap(batchSize);
    reaped.push(...jobs);
    if (jobs.length < batchSize) break;
  }
  return reaped;
}

/** Deletes old finished jobs in batches, bounded per run so it never holds locks for long. */
export async function cleanupFinishedJobs(
  store: QueueStore,
  options: ResolvedRetentionOptions,
  maxBatches = 20,
): Promise<number> {
  let total = 0;
  for (let batch = 0; batch < maxBatches; batch++) {
    const deleted = await store.cleanup({
      doneRetentionMs: options.doneMs,
      deadRetentionMs: options.deadMs,
      idempotencyRetentionMs: options.idempotencyKeyMs,
      batchSize: options.batchSize,
    });
    total += deleted;
    if (deleted < options.batchSize) break;
  }
  return total;
}

/**
 * One step of the ordered groups' repair sweep: checks up to `limit` groups (the sweep resumes
 * where the store's last call stopped), fixes those whose cached state disagrees with their jobs
 * and reports each fix to the listeners (`groupRepaired`, counted as
 * sqlqueue_group_repairs_total).
 */
export async function repairGroups(
  store: QueueStore,
  limit: number,
  listeners: readonly QueueEventListener[],
): Promise<GroupRepair[]> {
  const repairs = await store.repairGroups(limit);
  for (const repair of repairs) safeEmit(listeners, 'groupRepaired', repair);
  return repairs;
}
