import type { Clock } from '../clock.js';
import type { QueueEventListener } from '../events.js';
import { ThrottledErrorLog, type QueueLogger } from '../logger.js';
import type { QueueStore } from '../queue-store.js';
import { settleWithin } from '../timeout.js';
import type { ReapedJob, ThroughputCount } from '../types.js';

export const DEFAULT_THROUGHPUT_FLUSH_MS = 5_000;

export interface ThroughputRecorderDeps {
  store: Pick<QueueStore, 'recordThroughput'>;
  clock: Clock;
  logger: QueueLogger;
  flushIntervalMs: number;
}

/**
 * Counts this process's job outcomes per queue in memory and adds them to the database's
 * per-minute buckets (the dashboard's throughput chart) every `flushIntervalMs`. A completion
 * costs an increment, never a statement: one upsert per flush covers every queue, and an idle
 * process sends nothing. A count reaches the minute its flush runs in, so a bucket may hold up
 * to one flush interval of the minute before. A failed flush keeps its counts for the next one.
 */
export class ThroughputRecorder implements QueueEventListener {
  private pending = new Map<string, ThroughputCount>();
  private timer: { cancel(): void } | null = null;
  private inFlight: Promise<void> | null = null;
  private readonly errors: ThrottledErrorLog;

  constructor(private readonly deps: ThroughputRecorderDeps) {
    this.errors = new ThrottledErrorLog(deps.logger, 'recording throughput', deps.clock.now);
  }

  completed(event: { queue: string; claimToDoneMs?: number }): void {
    const count = this.count(event.queue);
    count.completed++;
    const ms = event.claimToDoneMs;
    if (typeof ms === 'number' && Number.isFinite(ms) && ms > 0) count.busyMs = (count.busyMs ?? 0) + Math.round(ms);
  }

  failed(event: { queue: string; dead: boolean }): void {
    const count = this.count(event.queue);
    if (event.dead) count.dead++;
    else count.failed++;
  }

  /** Leases the reaper found expired: a failed attempt, or a dead job when none was left. */
  reaped(jobs: readonly ReapedJob[]): void {
    for (const job of jobs) this.failed({ queue: job.queue, dead: job.state === 'dead' });
  }

  start(): void {
    this.timer ??= this.deps.clock.setInterval(() => void this.flush(), this.deps.flushIntervalMs);
  }

  /** Sends what is pending (at most one flush runs at a time; a tick during one is skipped). */
  flush(): Promise<void> {
    if (this.inFlight) return this.inFlight;
    if (this.pending.size === 0) return Promise.resolve();
    const batch = this.pending;
    this.pending = new Map();
    const counts = [...batch.values()];
    this.inFlight = this.deps.store
      .recordThroughput(counts)
      .then(
        () => this.errors.succeeded(),
        (error: unknown) => {
          for (const count of counts) this.merge(count);
          this.errors.failed(error, this.deps.flushIntervalMs);
        },
      )
      .finally(() => {
        this.inFlight = null;
      });
    return this.inFlight;
  }

  /** Stops the timer and sends the last counts, waiting at most `timeoutMs` (the database may be gone). */
  async stop(timeoutMs: number): Promise<void> {
    this.timer?.cancel();
    this.timer = null;
    const last = async () => {
      await this.inFlight;
      await this.flush();
    };
    if (!(await settleWithin(last(), timeoutMs)) || this.pending.size > 0) {
      this.deps.logger.warn(
        `throughput counts of the last ${this.deps.flushIntervalMs} ms were not recorded at shutdown`,
      );
    }
  }

  private count(queue: string): ThroughputCount {
    let count = this.pending.get(queue);
    if (!count) {
      count = { queue, completed: 0, failed: 0, dead: 0, busyMs: 0 };
      this.pending.set(queue, count);
    }
    return count;
  }

  private merge(from: ThroughputCount): void {
    const into = this.count(from.queue);
    into.completed += from.completed;
    into.failed += from.failed;
    into.dead += from.dead;
    into.busyMs = (into.busyMs ?? 0) + (from.busyMs ?? 0);
  }
}
