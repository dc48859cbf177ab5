import { Inject, Injectable } from '@nestjs/common';
import type { EnqueueCallOptions, EnqueueItem } from '../core/producer/index.js';
import type {
  AttemptRecord,
  BlockedGroupPage,
  FlowUsage,
  CancelResult,
  DeadJobPage,
  EnqueueResult,
  JobId,
  JobRecord,
  QueuePause,
  QueueStats,
} from '../core/types.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';
import { ScheduleAdmin } from '../core/schedules/index.js';
import type { ScheduleDefinition, ScheduleRecord } from '../core/schedules/index.js';
import { SqlQueueSchedulerHost } from './schedules.host.js';
import { unknownScheduleQueue } from './sql-queue.boot-checks.js';
import { SqlQueueValidationError } from '../core/errors.js';
import type { BrokerDeadMessagePage, BrokerQueueStats, BrokerRuntimeApi, BrokerSent } from '../broker/broker.types.js';
import type { SqlQueueRuntime } from './sql-queue.runtime.js';

/**
 * Enqueues jobs and administers queues. Inject it into controllers and services.
 * Every argument is validated before the database is touched.
 */
@Injectable()
export class QueueProducer {
  private readonly schedules: ScheduleAdmin;

  constructor(
    @Inject(SQL_QUEUE_RUNTIME) private readonly runtime: SqlQueueRuntime,
    schedulerHost: SqlQueueSchedulerHost,
  ) {
    this.schedules = new ScheduleAdmin({
      store: runtime.store,
      maxPayloadBytes: runtime.options.maxPayloadBytes,
      defaultMaxAttemptsFor: (queue) => runtime.defaultMaxAttempts(queue),
      checkQueue: (id, queue) =>
        unknownScheduleQueue(
          id,
          queue,
          new Set([...Object.keys(runtime.options.queues), ...runtime.handlerOptions.keys()]),
          runtime.options,
        ),
      changed: () => schedulerHost.wake(),
      enqueued: (queue) => runtime.producer.wake(queue),
      tracer: runtime.tracer,
    });
  }

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

  /**
   * Dead jobs of a queue, oldest first, `limit` (default 50) per page; pass `nextAfterId` on. A
   * Service Broker queue's dead jobs carry their message as the receiver stored it;
   * listDeadMessages() decodes it.
   */
  listDead(queue: string, page?: { limit?: number; afterId?: JobId | null }): Promise<DeadJobPage> {
    return this.runtime.producer.listDead(queue, page);
  }

  /**
   * Gives dead jobs (the ids, or 'all' of the queue) a fresh attempt budget; returns the ids
   * moved. In an ordered group (a broker queue's conversation too) a retried job runs in its old
   * place: before the group's later jobs that have not run yet.
   */
  retryDead(queue: string, jobIds: readonly JobId[] | 'all'): Promise<JobId[]> {
    return this.runtime.producer.retryDead(queue, jobIds);
  }

  /** Deletes dead jobs of a queue: all, only those dead longer than `olderThanMs`, or only `ids`. */
  purgeDead(queue: string, options?: { olderThanMs?: number; ids?: readonly JobId[] }): Promise<number> {
    return this.runtime.producer.purgeDead(queue, options);
  }

  /**
   * Pauses a queue on every instance. The pause is stored in the database: it survives restarts
   * and holds for instances that boot later. From its commit on no claim leases a job of the
   * queue (readers notice within one poll interval, as for an idle queue); running jobs finish
   * and their completions are written; enqueue still works. Returns true when this call paused
   * the queue, false when it was paused already (the first reason stays).
   */
  pauseQueue(queue: string, options?: { reason?: string }): Promise<boolean> {
    return this.runtime.producer.pauseQueue(queue, options);
  }

  /** Ends a queue's pause and wakes its readers (here at once, elsewhere through NOTIFY or the doorbell); true when it was paused. */
  resumeQueue(queue: string): Promise<boolean> {
    return this.runtime.producer.resumeQueue(queue);
  }

  /**
   * Cancels a job. A ready or delayed job is canceled at once and never runs (`canceled`); an
   * ordered group it headed moves on. A running job is marked (`canceling`): its owner learns of
   * it on its next heartbeat (a third of the lease; at once where a wake-up reaches it), aborts
   * `context.signal` with a SqlQueueCanceledError, and records the attempt as canceled; the job
   * is not retried, whatever the handler then does. A job already finished is reported
   * (`finished`, with its state) and left alone.
   */
  cancel(jobId: JobId, options?: { reason?: string }): Promise<CancelResult> {
    return this.runtime.producer.cancel(jobId, options);
  }

  /** cancel() for up to 1,000 jobs in one statement; one result per distinct id, in input order. */
  cancelMany(jobIds: readonly JobId[], options?: { reason?: string }): Promise<CancelResult[]> {
    return this.runtime.producer.cancelMany(jobIds, options);
  }

  /** cancel() of the job with this idempotency key in the queue; null when no job of the queue has it. */
  cancelByKey(queue: string, idempotencyKey: string, options?: { reason?: string }): Promise<CancelResult | null> {
    return this.runtime.producer.cancelByKey(queue, idempotencyKey, options);
  }

  /**
   * Waits until a job is finished (done, dead or canceled) and resolves with its record; `result`
   * is what its handler returned. Polls getJob() (25 ms doubling to 1 s); rejects with
   * SqlQueueWaitTimeoutError after `timeoutMs` (default 30 s). The request/response pattern:
   * `const { jobId } = await producer.enqueue(…); const job = await producer.waitFor(jobId);`
   */
  waitFor(jobId: JobId, options?: { timeoutMs?: number }): Promise<JobRecord> {
    return this.runtime.producer.waitFor(jobId, options);
  }

  /**
   * A queue's flow limits and what they hold back now: running jobs, starts in the rate window,
   * keys at their limit, and the `top` (default 10) busiest keys with their running and waiting
   * jobs (see docs/flow-control.md).
   */
  flowUsage(queue: string, options?: { top?: number }): Promise<FlowUsage> {
    return this.runtime.producer.flowUsage(queue, options);
  }

  /** Every paused queue, with its reason and when it was paused, by name. */
  listPausedQueues(): Promise<QueuePause[]> {
    return this.runtime.producer.listPausedQueues();
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
   * Sends a message to a Service Broker queue declared under the `broker` option (SQL Server).
   * Messages with the same `groupKey` travel on one long-lived dialog, so the target handles
   * them one at a time, in send order; without a key, messages spread over a few shared dialogs
   * and no order is promised. With `transaction` (an mssql Transaction), the message is sent
   * only if the caller commits. The body is validated (and encoded per the queue's format)
   * before the database is touched.
   */
  send<T>(queue: string, body: T, options?: { groupKey?: string; transaction?: unknown }): Promise<BrokerSent> {
    return this.broker(queue).send(queue, body, options);
  }

  /**
   * The dead jobs of a broker queue as the messages they carry (body decoded per the queue's
   * format, conversation, sequence number), oldest first, `limit` (default 50) per page. Retry or
   * purge them by id with retryDead() and purgeDead(), as any dead job.
   */
  listDeadMessages(queue: string, page?: { limit?: number; afterId?: string | null }): Promise<BrokerDeadMessagePage> {
    return this.broker(queue).listDeadMessages(queue, page);
  }

  /** Messages waiting in a broker queue (not moved to its table queue yet), and its dead jobs. */
  brokerStats(queue: string): Promise<BrokerQueueStats> {
    return this.broker(queue).stats(queue);
  }

  private broker(queue: string): BrokerRuntimeApi {
    const broker = this.runtime.broker;
    if (!broker?.queue(queue)) {
      const declared = broker?.options.queues.map((q) => `'${q.name}'`).join(', ');
      throw new SqlQueueValidationError(
        declared
          ? `'${String(queue)}' is not a broker queue: the broker option declares ${declared}`
          : `'${String(queue)}' is not a broker queue: declare Service Broker queues under the broker option (SQL Server only); table queues take enqueue()`,
      );
    }
    return broker;
  }

  /**
   * Creates or updates a recurring job (by id): each tick of `cron` (in `timezone`, default UTC)
   * enqueues one job into `queue`, once across every instance. A changed cron or time zone
   * applies from the next tick after now. Returns the schedule with its next fire time.
   * Checked before the database is touched: invalid cron, unknown time zone, unknown queue.
   */
  schedule(id: string, definition: ScheduleDefinition): Promise<ScheduleRecord> {
    return this.schedules.schedule(id, definition);
  }

  /** Deletes a recurring job; false when there was none. Jobs it already enqueued stay. */
  unschedule(id: string): Promise<boolean> {
    return this.schedules.unschedule(id);
  }

  /** Every recurring job with its next fire time, last fire time and last tick. */
  listSchedules(): Promise<ScheduleRecord[]> {
    return this.schedules.list();
  }

  /** One recurring job, or null. */
  getSchedule(id: string): Promise<ScheduleRecord | null> {
    return this.schedules.get(id);
  }

  /** Stops a recurring job's ticks until resumeSchedule(). */
  pauseSchedule(id: string): Promise<void> {
    return this.schedules.pause(id);
  }

  /** Resumes a paused recurring job from its next tick after now (the paused period is not caught up). */
  resumeSchedule(id: string): Promise<void> {
    return this.schedules.resume(id);
  }

  /** Enqueues one job of a recurring job now, outside its ticks (its context names the schedule). */
  triggerSchedule(id: string): Promise<EnqueueResult & { tick: Date }> {
    return this.schedules.trigger(id);
  }

  /**
   * Wakes readers of a queue here and in other processes. Useful right after committing a
   * transaction that enqueued jobs, so readers need not wait for their next poll.
   */
  wake(queue: string): void {
    this.runtime.producer.wake(queue);
  }
}
