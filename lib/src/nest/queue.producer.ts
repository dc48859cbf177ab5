import { Inject, Injectable } from '@nestjs/common';
import type { EnqueueCallOptions, EnqueueItem } from '../core/producer.js';
import type {
  AttemptRecord,
  BlockedGroupPage,
  DeadJobPage,
  EnqueueResult,
  JobId,
  JobRecord,
  QueueStats,
} from '../core/types.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';
import type { SqlQueueRuntime } from './sql-queue.runtime.js';

/**
 * Enqueues jobs and administers queues. Inject it into controllers and services.
 * Every argument is validated before the database is touched.
 */
@Injectable()
export class QueueProducer {
  constructor(@Inject(SQL_QUEUE_RUNTIME) private readonly runtime: SqlQueueRuntime) {}

  /**
   * Enqueues one job. With `idempotencyKey`, a second enqueue of the same key in the same queue
   * returns the first job (`created: false`). With `transaction`, the job commits or rolls
   * back with the caller's own writes.
   */
  enqueue<T>(queue: string, payload: T, options?: EnqueueCallOptions): Promise<EnqueueResult> {
    return this.runtime.producer.enqueue(queue, payload, options);
  }

  /** Enqueues many jobs of one queue in one round trip (per 10,000), results in input order. */
  enqueueMany<T>(
    queue: string,
    items: readonly EnqueueItem<T>[],
    options?: { transaction?: unknown },
  ): Promise<EnqueueResult[]> {
    return this.runtime.producer.enqueueMany(queue, items, options);
  }

  /** One job by id (a decimal string), or null if it does not exist (or was cleaned up). */
  getJob(jobId: JobId): Promise<JobRecord | null> {
    return this.runtime.producer.getJob(jobId);
  }

  /** Failed and lease-expired attempts of a job, and its completion when done. */
  getAttempts(jobId: JobId): Promise<AttemptRecord[]> {
    return this.runtime.producer.getAttempts(jobId);
  }

  /** Live figures of one queue: ready, delayed, leased, expired leases, dead, retrying, oldest ready age. */
  stats(queue: string): Promise<QueueStats> {
    return this.runtime.producer.stats(queue);
  }

  /** Dead jobs of a queue, oldest first, `limit` (default 50) per page; pass `nextAfterId` on. */
  listDead(queue: string, page?: { limit?: number; afterId?: JobId | null }): Promise<DeadJobPage> {
    return this.runtime.producer.listDead(queue, page);
  }

  /** Gives dead jobs (the ids, or 'all' of the queue) a fresh attempt budget; returns the ids moved. */
  retryDead(queue: string, jobIds: readonly JobId[] | 'all'): Promise<JobId[]> {
    return this.runtime.producer.retryDead(queue, jobIds);
  }

  /** Deletes dead jobs of a queue (only those dead longer than `olderThanMs`, if given). */
  purgeDead(queue: string, options?: { olderThanMs?: number }): Promise<number> {
    return this.runtime.producer.purgeDead(queue, options);
  }

  /**
   * Ordered groups stopped by a dead job (`groupOnDead: 'block'`), by group key, `limit`
   * (default 50) per page; pass `nextAfterKey` on. Retry (`retryDead`) or purge the blocking job
   * to release its group.
   */
  listBlockedGroups(queue: string, page?: { limit?: number; afterKey?: string | null }): Promise<BlockedGroupPage> {
    return this.runtime.producer.listBlockedGroups(queue, page);
  }

  /**
   * Wakes readers of a queue here and in other processes. Useful right after committing a
   * transaction that enqueued jobs, so readers need not wait for their next poll.
   */
  wake(queue: string): void {
    this.runtime.producer.wake(queue);
  }
}
