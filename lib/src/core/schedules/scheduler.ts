import { PollBackoff } from '../backoff.js';
import { systemClock, type Clock } from '../clock.js';
import { safeEmit, type QueueEventListener } from '../events.js';
import { silentLogger, ThrottledErrorLog, type QueueLogger } from '../logger.js';
import { planFirings, type PlannedFiring } from './schedule-plan.js';
import type { ScheduleRow, ScheduleStore } from './schedule.types.js';

export interface SqlQueueSchedulerDeps {
  store: ScheduleStore;
  clock?: Clock;
  logger?: QueueLogger;
  listeners?: readonly QueueEventListener[];
  /** Longest sleep between two looks at the schedules: the idle cost is one statement per maxPollMs. */
  maxPollMs: number;
  /** First pause after a failure, or while another instance holds the due schedules (default min(1 s, maxPollMs)). */
  minPollMs?: number;
  /** Schedules fired per transaction (default 100). */
  batch?: number;
  /**
   * Sleep while the database holds no schedule to fire at all (default 30 s, or maxPollMs if
   * longer): an application that uses no recurring jobs pays one statement per 30 s, not per
   * maxPollMs. A schedule made through this process's API wakes the loop at once.
   */
  emptyPollMs?: number;
  /** This process's default maxAttempts for a queue's jobs (NewJob.defaultMaxAttempts). */
  defaultMaxAttemptsFor(queue: string): number;
  /** See planFirings (defaults 1,000 and 60 s). */
  maxCatchUp?: number;
  graceMs?: number;
  random?: () => number;
}

/**
 * Fires due schedules: asks the store how long until the earliest is due (one statement),
 * sleeps that long (at most maxPollMs, cut short by wake() or stop()), then fires them in
 * batches, each batch one transaction that enqueues the ticks' jobs and advances the
 * schedules. Every instance runs one; the store's skip-locked claim makes each tick fire once.
 * Failures are logged (throttled) and retried after a growing pause; the loop never ends on its own.
 */
export class SqlQueueScheduler {
  private readonly clock: Clock;
  private readonly logger: QueueLogger;
  private readonly listeners: readonly QueueEventListener[];
  private readonly batch: number;
  private readonly emptyPollMs: number;
  private readonly errorBackoff: PollBackoff;
  /** Due schedules another instance holds: pause before trying again instead of spinning. */
  private readonly heldBackoff: PollBackoff;
  private readonly errors: ThrottledErrorLog;
  private readonly stopping = new AbortController();
  private loop: Promise<void> | null = null;
  private sleeper: AbortController | null = null;
  private woken = false;

  constructor(private readonly deps: SqlQueueSchedulerDeps) {
    this.clock = deps.clock ?? systemClock;
    this.logger = deps.logger ?? silentLogger;
    this.listeners = deps.listeners ?? [];
    this.batch = deps.batch ?? 100;
    this.emptyPollMs = Math.max(deps.emptyPollMs ?? 30_000, deps.maxPollMs);
    const minPollMs = Math.min(deps.minPollMs ?? 1_000, deps.maxPollMs);
    this.errorBackoff = new PollBackoff(minPollMs, deps.maxPollMs, deps.random);
    this.heldBackoff = new PollBackoff(minPollMs, deps.maxPollMs, deps.random);
    this.errors = new ThrottledErrorLog(this.logger, 'scheduler', () => this.clock.now());
  }

  /** Starts the loop (once; later calls do nothing). */
  start(): void {
    if (this.loop || this.stopping.signal.aborted) return;
    this.loop = this.run();
  }

  /** Stops the loop, waiting for a round in flight to finish. Idempotent. */
  async stop(): Promise<void> {
    this.stopping.abort();
    this.sleeper?.abort();
    await this.loop;
  }

  /**
   * Looks at the schedules at once: called after an upsert, resume or trigger so a new next
   * run is seen without waiting out the current sleep.
   */
  wake(): void {
    this.woken = true;
    this.sleeper?.abort();
  }

  private async run(): Promise<void> {
    // Slept until a schedule's due time: fire without asking again.
    let dueNow = false;
    // The last firing round found due schedules but fired none (another instance holds them).
    let held = false;
    while (!this.stopping.signal.aborted) {
      try {
        if (!dueNow) {
          this.woken = false;
          const { dueInMs } = await this.deps.store.scheduleDueIn();
          if (this.stopping.signal.aborted) break;
          if (dueInMs === null || dueInMs > 0) {
            this.succeeded();
            held = false;
            this.heldBackoff.reset();
            if (this.woken) continue;
            const wait = dueInMs === null ? this.emptyPollMs : Math.min(Math.ceil(dueInMs), this.deps.maxPollMs);
            const woke = await this.sleep(wait, true);
            dueNow = !woke && dueInMs !== null && dueInMs <= this.deps.maxPollMs;
            continue;
          }
          if (held && (await this.sleep(this.heldBackoff.next(), true))) continue;
        }
        dueNow = false;
        const fired = await this.fireDue();
        this.succeeded();
        held = fired === 0;
        if (!held) this.heldBackoff.reset();
      } catch (error) {
        dueNow = false;
        const delay = this.errorBackoff.next();
        this.errors.failed(error, delay);
        await this.sleep(delay, false);
      }
    }
  }

  /** Fires due schedules batch after batch while full batches come back; returns how many fired. */
  private async fireDue(): Promise<number> {
    let total = 0;
    for (;;) {
      const planned = new Map<string, PlannedFiring>();
      let warnings: string[] = [];
      let planning: readonly ScheduleRow[] = [];
      let firings;
      try {
        firings = await this.deps.store.fireDueSchedules(this.batch, (rows, now) => {
          // The store may plan again after a retry: keep only the last plan's details.
          planning = rows;
          warnings = [];
          planned.clear();
          const plan = planFirings(rows, now, {
            maxCatchUp: this.deps.maxCatchUp,
            graceMs: this.deps.graceMs,
            defaultMaxAttemptsFor: (queue) => this.deps.defaultMaxAttemptsFor(queue),
            onWarning: (message) => warnings.push(message),
          });
          for (const firing of plan) planned.set(firing.id, firing);
          return plan;
        });
      } catch (error) {
        const ids = planning.map((row) => `'${row.id}'`).join(', ');
        throw new Error(
          `firing due schedules${ids ? ` (${ids})` : ''} failed: ${(error as Error)?.message ?? String(error)}`,
          { cause: error },
        );
      }
      // Logged after the commit, so a rolled-back plan warns nothing.
      for (const message of warnings) this.logger.warn(message);
      for (const firing of firings) {
        const detail = planned.get(firing.id);
        safeEmit(this.listeners, 'scheduleFired', {
          id: firing.id,
          queue: detail?.queue ?? firing.jobs[0]?.queue ?? '',
          ticks: firing.jobs.length,
          skipped: detail?.skipped ?? 0,
          lagMs: detail?.lagMs ?? 0,
        });
      }
      total += firings.length;
      if (firings.length < this.batch || this.stopping.signal.aborted) return total;
    }
  }

  private succeeded(): void {
    this.errors.succeeded();
    this.errorBackoff.reset();
  }

  /** Sleeps on the clock, until stop() (or wake(), when `wakeable`); returns whether wake() cut it short. */
  private async sleep(ms: number, wakeable: boolean): Promise<boolean> {
    if (this.stopping.signal.aborted) return false;
    const sleeper = new AbortController();
    const onStop = () => sleeper.abort();
    this.stopping.signal.addEventListener('abort', onStop, { once: true });
    if (wakeable) this.sleeper = sleeper;
    try {
      await this.clock.sleep(ms, sleeper.signal);
    } finally {
      this.stopping.signal.removeEventListener('abort', onStop);
      if (this.sleeper === sleeper) this.sleeper = null;
    }
    return sleeper.signal.aborted && !this.stopping.signal.aborted;
  }
}
