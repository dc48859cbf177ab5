import { safeEmit } from '../events.js';
import type { ResolvedQueueOptions } from '../options.js';
import { SqlQueueConfigError, SqlQueueShutdownError } from '../errors.js';
import { settleWithin } from '../timeout.js';
import { NO_TRACING, type QueueTracer } from '../tracing.js';
import { MovingAverage, readersToStart, shouldRetireAfterEmptyClaim } from './activation.js';
import { ClaimLoop } from './claim-loop.js';
import type { JobHandler } from './handler.js';
import { abortJob, HeldJobs, withFollowers, type HeldJob } from './held-jobs.js';
import { JobAcker, type AckerDeps } from './job-acker.js';
import { JobRunner, SHUTDOWN_ABANDON_GRACE_MS } from './job-runner.js';
import { LeaseKeeper } from './lease-keeper.js';

export interface QueueConsumerDeps extends AckerDeps {
  random?: () => number;
  /** Spans around handlers (and, if asked for, claims); none by default. */
  tracer?: QueueTracer;
}

/** A point-in-time view of one queue's readers, for liveness checks and metrics. */
export interface QueueConsumerSnapshot {
  queue: string;
  readers: number;
  running: number;
  buffered: number;
  /** Engine clock time the claim loop last made progress (claimed, slept, or failed and backed off). */
  lastLoopAt: number;
  /** True while claims fail (database unreachable, …). */
  claimFailing: boolean;
  stopping: boolean;
  /** The queue's longest idle pause: a liveness check's yardstick for "no progress". */
  maxPollMs: number;
  /** Most readers this process runs for the queue: pods follow from the scale recommendation with it. */
  maxReaders: number;
}

/**
 * Runs the handlers of one queue. Its parts, each in its own file:
 * - readers (here): between minReaders and maxReaders, per the activation rule in
 *   activation.ts; each takes a unit of work (a job, or an ordered group's batch) at a time;
 * - the claim loop (claim-loop.ts): claims sized to the free handler slots plus a prefetch
 *   buffer, and the idle pauses between them;
 * - the job runner (job-runner.ts): a handler per job, after its claim committed, outside any
 *   transaction;
 * - the lease keeper (lease-keeper.ts): renews the leases of every job held here;
 * - the acker (job-acker.ts): writes completions, failures and give-backs in batches;
 * - shutdown (here): stops claiming, lets handlers finish, gives back what did not start.
 */
export class QueueConsumer {
  private readers = 0;
  private readonly readerDone = new Set<Promise<void>>();
  private readonly waiting: ((job: HeldJob | null) => void)[] = [];
  private readonly jobs: HeldJobs;
  /** Engine clock time a reader started waiting with none waiting before; null if none waits. */
  private waitingSince: number | null = null;
  private isStopping = false;
  private beginStopping!: () => void;
  /** Resolves when shutdown begins: a group batch stops waiting for a completion then. */
  private readonly stopped$ = new Promise<'stopping'>((resolve) => (this.beginStopping = () => resolve('stopping')));
  private stopped: Promise<{ finished: number; aborted: number; released: number }> | null = null;
  private started = false;
  private readonly acker: JobAcker;
  private readonly claims: ClaimLoop;
  private readonly leases: LeaseKeeper;
  private readonly runner: JobRunner;
  private timers: { cancel(): void }[] = [];
  /** Heartbeat runs in flight (each bounded), awaited by shutdown. */
  private readonly background = new Set<Promise<void>>();

  constructor(
    private readonly deps: QueueConsumerDeps,
    readonly options: ResolvedQueueOptions,
    handler: JobHandler,
  ) {
    if (options.transactional && !deps.store.beginHandlerTransaction) {
      throw new SqlQueueConfigError(
        `queue '${options.queue}': transactional: true needs a store that opens handler transactions, and this one does not`,
      );
    }
    const tracer = deps.tracer ?? NO_TRACING;
    const handlerMs = new MovingAverage();
    const stopping = () => this.isStopping;
    this.jobs = new HeldJobs(options.leaseMs);
    this.acker = new JobAcker(deps, options, (held, completed) => this.settled(held, completed));
    this.claims = new ClaimLoop(deps, options, this.jobs, this.acker, tracer, handlerMs, {
      stopping,
      claimEnded: () => this.pump(),
      emptyClaim: () => this.retireSurplusWaiters(),
    });
    this.leases = new LeaseKeeper(deps, options, this.jobs, this.acker, (held) => this.claims.dropBuffered(held));
    this.runner = new JobRunner(deps, options, this.jobs, this.acker, this.leases, handler, tracer, handlerMs, {
      stopping,
      stopped: this.stopped$,
    });
  }

  get queue(): string {
    return this.options.queue;
  }

  start(): void {
    if (this.started || this.isStopping) return;
    this.started = true;
    for (let i = 0; i < this.options.minReaders; i++) this.addReader('start');
    this.timers.push(this.deps.clock.setInterval(() => this.track(this.tick()), this.leases.intervalMs));
  }

  /** Keeps a timer task's promise until it settles, so shutdown can wait for it. */
  private track(task: Promise<void>): void {
    this.background.add(task);
    void task.finally(() => this.background.delete(task));
  }

  /** The lease keeper's tick: buffered jobs that would only wait go back first. */
  private async tick(): Promise<void> {
    if (this.jobs.size === 0) return;
    const now = this.deps.clock.now();
    this.claims.releaseStale(now);
    await this.leases.renew(now);
  }

  /** A job of this queue may have been canceled: heartbeat every held job now to find out. */
  cancelWake(): void {
    if (this.isStopping || this.jobs.size === 0) return;
    this.leases.renewAllSoon();
    void this.leases.renew(this.deps.clock.now());
  }

  /** New work may be there: end the idle pause and claim at once. */
  wake(): void {
    if (this.isStopping) return;
    this.claims.wake();
    this.pump();
  }

  snapshot(): QueueConsumerSnapshot {
    return {
      queue: this.queue,
      readers: this.readers,
      running: this.jobs.running.size,
      buffered: this.claims.buffer.length,
      // A loop that rightly slept while every reader was busy starts its stall clock only when
      // a reader begins to wait, not at its last claim.
      lastLoopAt: Math.max(this.claims.lastLoopAt, this.waiting.length > 0 ? (this.waitingSince ?? 0) : 0),
      claimFailing: this.claims.failing,
      stopping: this.isStopping,
      maxPollMs: this.options.maxPollMs,
      maxReaders: this.options.maxReaders,
    };
  }

  // ---- readers --------------------------------------------------------------------------

  /** Starts a reader; it takes a buffered job, if any, before this returns. */
  private addReader(reason: 'start' | 'activation'): void {
    this.readers++;
    safeEmit(this.deps.listeners, 'readersChanged', { queue: this.queue, readers: this.readers, reason });
    const done = this.readLoop().finally(() => {
      this.readerDone.delete(done);
    });
    this.readerDone.add(done);
  }

  private async readLoop(): Promise<void> {
    try {
      for (;;) {
        const held = await this.take();
        if (!held) return;
        await this.runner.runBatch(withFollowers(held));
      }
    } finally {
      this.readers--;
      safeEmit(this.deps.listeners, 'readersChanged', {
        queue: this.queue,
        readers: this.readers,
        reason: this.isStopping ? 'stop' : 'retire',
      });
    }
  }

  /** The next job for a reader; null tells the reader to retire (or that the queue stops). */
  private take(): Promise<HeldJob | null> {
    if (this.isStopping) return Promise.resolve(null);
    const next = this.claims.buffer.shift();
    this.claims.schedule();
    if (next) return Promise.resolve(next);
    return new Promise((resolve) => {
      if (this.waiting.length === 0) this.waitingSince = this.deps.clock.now();
      this.waiting.push(resolve);
    });
  }

  /**
   * Hands buffered jobs to waiting readers, starts readers for the jobs left over (the
   * activation rule: a claimed job that no idle reader took), and schedules the next claim.
   */
  private pump(): void {
    const { buffer } = this.claims;
    while (this.waiting.length > 0 && buffer.length > 0) this.waiting.shift()!(buffer.shift()!);
    if (!this.isStopping) {
      for (let n = readersToStart(this.readers, this.options.maxReaders, buffer.length); n > 0; n--) {
        this.addReader('activation');
      }
    }
    this.claims.schedule();
  }

  /** Seed 003: a reader whose claim came back empty retires while more than the minimum run. */
  private retireSurplusWaiters(): void {
    let readers = this.readers;
    while (this.waiting.length > 0 && shouldRetireAfterEmptyClaim(readers, this.options.minReaders)) {
      this.waiting.pop()!(null);
      readers--;
    }
  }

  /**
   * The job's outcome is recorded. An ordered group's next job became claimable with it, but
   * a claim sent meanwhile saw the group still held and may have started an idle pause: claim
   * again now, so a group's jobs follow each other without waiting out a poll interval.
   */
  private settled(held: HeldJob, completed: boolean): void {
    held.recorded?.(completed);
    held.recorded = null;
    this.jobs.forget(held);
    if (held.job.groupKey !== null) this.wake();
  }

  // ---- shutdown ---------------------------------------------------------------------------

  /**
   * Stops claiming, gives back jobs that never started, lets running handlers finish for up
   * to `timeoutMs`, then aborts them; flushes completions. What is still unfinished comes
   * back through its lease, so nothing is lost.
   */
  stop(timeoutMs: number): Promise<{ finished: number; aborted: number; released: number }> {
    // A second call waits for the first: its caller may close the pool next.
    this.stopped ??= this.shutDown(timeoutMs);
    return this.stopped;
  }

  private async shutDown(timeoutMs: number): Promise<{ finished: number; aborted: number; released: number }> {
    this.isStopping = true;
    this.beginStopping();
    this.claims.endPauses();
    while (this.waiting.length > 0) this.waiting.shift()!(null);
    const released = this.claims.buffer.splice(0).flatMap(withFollowers);
    this.acker.release(released);

    // Claims already sent: wait for them (bounded), so the jobs they bring back are given back
    // now, before connections close, instead of staying leased until their lease runs out.
    if (!(await settleWithin(Promise.all(this.claims.inFlight()), timeoutMs + SHUTDOWN_ABANDON_GRACE_MS))) {
      this.deps.logger.warn(
        `queue '${this.queue}': a claim was still in flight at shutdown (database unresponsive?); jobs it leased come back when their lease expires`,
      );
    }
    const { running } = this.jobs;
    const runningAtStop = running.size;
    const allDone = () => Promise.all([...running.values()]).then(() => undefined);
    const deadline = new AbortController();
    const finishedInTime = await Promise.race([
      allDone().then(() => true),
      this.deps.clock.sleep(timeoutMs, deadline.signal).then(() => false),
    ]);
    deadline.abort();
    let aborted = 0;
    if (!finishedInTime) {
      for (const held of running.keys()) {
        if (held.aborted) continue;
        held.shutdownAborted = true;
        abortJob(held, new SqlQueueShutdownError());
        aborted++;
      }
      await allDone();
    }
    await Promise.all([...this.readerDone]);
    await this.acker.drain();
    for (const timer of this.timers) timer.cancel();
    this.timers = [];
    // A heartbeat or activation probe still running finishes before connections close.
    await settleWithin(Promise.all([...this.background]), 5_000);
    return { finished: runningAtStop - aborted, aborted, released: released.length };
  }
}
