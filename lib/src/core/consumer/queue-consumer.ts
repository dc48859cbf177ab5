import { parseScheduleJobKey } from '../schedules/schedule-options.js';
import { autoPrefetch, claimSize, MovingAverage, readersToStart, shouldRetireAfterEmptyClaim } from './activation.js';
import { PollBackoff } from '../backoff.js';
import {
  SqlQueueJobTimeoutError,
  SqlQueueLeaseLostError,
  SqlQueueShutdownError,
  SqlQueueUnrecoverableError,
  SqlQueueValidationError,
} from '../errors.js';
import { safeEmit } from '../events.js';
import type { JobContext, JobHandler } from './handler.js';
import { abortJob, JobAcker, signalOf, withFollowers, type AckerDeps, type HeldJob } from './job-acker.js';
import { ThrottledErrorLog } from '../logger.js';
import type { ResolvedQueueOptions } from '../options.js';
import { settleWithin, withTimeout } from '../timeout.js';
import { NO_TRACING, type QueueTracer } from '../tracing.js';
import type { ClaimedJob, HeartbeatResult } from '../types.js';
import { INT_MAX } from '../validation.js';

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
}

/** How long after aborting a handler the reader keeps waiting for it before moving on. */
const ABANDON_GRACE_MS = 5_000;
const SHUTDOWN_ABANDON_GRACE_MS = 1_000;
const ERROR_BACKOFF_MIN_MS = 100;
const ERROR_BACKOFF_MAX_MS = 5_000;

/**
 * Runs the handlers of one queue: readers (between minReaders and maxReaders, per the
 * activation rule in activation.ts) take jobs from one claim loop that claims in batches
 * sized to the free handler slots plus a prefetch buffer; a lease keeper
 * renews the leases of every job held here; an acker writes completions and failures in
 * batches. The handler always runs after the claim committed, outside any transaction.
 */
export class QueueConsumer {
  private readers = 0;
  private readonly readerDone = new Set<Promise<void>>();
  private readonly waiting: ((job: HeldJob | null) => void)[] = [];
  private readonly buffer: HeldJob[] = [];
  private readonly held = new Map<string, HeldJob>();
  /** Keyed by the hold, not the job id: a job re-claimed here while its old run ends is a new entry. */
  private readonly running = new Map<HeldJob, Promise<unknown>>();
  /** Claim statements in flight, and how many jobs they asked for. */
  private claimsInFlight = 0;
  private requested = 0;
  private claimScheduled = false;
  /** Claims in flight, awaited by shutdown so that what they return is given back. */
  private readonly claims = new Set<Promise<void>>();
  /** Engine clock time a reader started waiting with none waiting before; null if none waits. */
  private waitingSince: number | null = null;
  private wokenDuringClaim = false;
  private stopping = false;
  private beginStopping!: () => void;
  /** Resolves when shutdown begins: a group batch stops waiting for a completion then. */
  private readonly stopped$ = new Promise<'stopping'>((resolve) => (this.beginStopping = () => resolve('stopping')));
  private stopped: Promise<{ finished: number; aborted: number; released: number }> | null = null;
  private started = false;
  /** The claim loop's pauses (two claims may overlap, so two may pause); aborting them wakes it. */
  private readonly idleSleeps = new Set<AbortController>();
  /** After an empty claim one claim at a time is enough, even with a prefetch buffer. */
  private lastClaimEmpty = false;
  /** Recent claim round trips and handler run times, for `prefetch: 'auto'`. */
  private readonly claimMs = new MovingAverage();
  private readonly handlerMs = new MovingAverage();
  private lastLoopAt: number;
  private readonly pollBackoff: PollBackoff;
  private errorBackoffMs = ERROR_BACKOFF_MIN_MS;
  private readonly claimErrors: ThrottledErrorLog;
  private readonly heartbeatErrors: ThrottledErrorLog;
  private readonly acker: JobAcker;
  private timers: { cancel(): void }[] = [];
  /** Heartbeat runs in flight (each bounded), awaited by shutdown. */
  private readonly background = new Set<Promise<void>>();
  private heartbeatRunning = false;
  private readonly tracer: QueueTracer;

  constructor(
    private readonly deps: QueueConsumerDeps,
    readonly options: ResolvedQueueOptions,
    private readonly handler: JobHandler,
  ) {
    const random = deps.random ?? Math.random;
    this.pollBackoff = new PollBackoff(options.minPollMs, options.maxPollMs, random);
    this.lastLoopAt = deps.clock.now();
    const now = () => deps.clock.now();
    this.claimErrors = new ThrottledErrorLog(deps.logger, `claiming from queue '${options.queue}'`, now);
    this.heartbeatErrors = new ThrottledErrorLog(deps.logger, `renewing leases in queue '${options.queue}'`, now);
    this.acker = new JobAcker(deps, options, (held, completed) => this.settled(held, completed));
    this.tracer = deps.tracer ?? NO_TRACING;
  }

  get queue(): string {
    return this.options.queue;
  }

  start(): void {
    if (this.started || this.stopping) return;
    this.started = true;
    for (let i = 0; i < this.options.minReaders; i++) this.addReader('start');
    const heartbeatEvery = Math.max(20, Math.min(Math.floor(this.options.leaseMs / 6), 5_000));
    this.timers.push(this.deps.clock.setInterval(() => this.track(this.renewLeases()), heartbeatEvery));
  }

  /** Keeps a timer task's promise until it settles, so shutdown can wait for it. */
  private track(task: Promise<void>): void {
    this.background.add(task);
    void task.finally(() => this.background.delete(task));
  }

  /** New work may be there: end the idle pause and claim at once. */
  wake(): void {
    if (this.stopping) return;
    this.pollBackoff.reset();
    // A claim already in flight may have looked before the new job committed: if it comes
    // back empty, claim again at once instead of pausing.
    if (this.claimsInFlight > 0) this.wokenDuringClaim = true;
    this.endPauses();
    this.pump();
  }

  snapshot(): QueueConsumerSnapshot {
    return {
      queue: this.queue,
      readers: this.readers,
      running: this.running.size,
      buffered: this.buffer.length,
      // A loop that rightly slept while every reader was busy starts its stall clock only when
      // a reader begins to wait, not at its last claim.
      lastLoopAt: Math.max(this.lastLoopAt, this.waiting.length > 0 ? (this.waitingSince ?? 0) : 0),
      claimFailing: this.claimErrors.failing,
      stopping: this.stopping,
      maxPollMs: this.options.maxPollMs,
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
        await this.runBatch(withFollowers(held));
      }
    } finally {
      this.readers--;
      safeEmit(this.deps.listeners, 'readersChanged', {
        queue: this.queue,
        readers: this.readers,
        reason: this.stopping ? 'stop' : 'retire',
      });
    }
  }

  /**
   * Runs one job, or an ordered group's batch in id order, each after the one before is done: its
   * completion recorded in the database, not only sent. So a crash never runs a group's job again
   * after its successor started (it would, had the successor started while the completion was
   * still on its way: the lost completion brings the job back, behind the successor's run). A
   * batch stops at the first job that does not complete: a failure's statement gives the rest
   * back in the database (as does a reaped or lost lease, or a completion refused as lost), so
   * they are only let go here; a job given back, or shutdown, gives the rest back with it.
   */
  private async runBatch(batch: HeldJob[]): Promise<void> {
    for (const [index, held] of batch.entries()) {
      const followed = index + 1 < batch.length;
      const done = followed ? new Promise<boolean>((resolve) => (held.recorded = resolve)) : Promise.resolve(true);
      let outcome: RunOutcome;
      try {
        outcome = await this.run(held);
      } catch (error) {
        // A bug must not take the reader down or keep renewing a lease for nothing: the job
        // is let go, and its lease brings it back.
        this.deps.logger.error(
          `job ${held.job.id} in queue '${this.queue}': unexpected error after its handler ran; the job comes back when its lease expires: ${describeReason(error)}`,
          error instanceof Error ? error.stack : undefined,
        );
        this.forget(held);
        outcome = 'ended';
      }
      const rest = batch.slice(index + 1);
      if (rest.length === 0) return;
      // At shutdown the rest is given back below at once, whether the completion landed or not.
      if (outcome === 'completed' && (await Promise.race([done, this.stopped$])) === false) outcome = 'ended';
      held.recorded = null;
      // A handler that blocked the event loop past the lease may return before any heartbeat
      // tick could notice: the batch's token may be void and its group taken by another reader.
      if (outcome === 'completed' && this.deps.clock.now() >= rest[0]!.localLeaseUntil) outcome = 'ended';
      // Heartbeats cannot extend a lease past claim + maxDurationMs, which counts from the
      // batch's claim: past half of it, the rest goes back for a fresh claim, as a prefetched
      // job that waited that long does (releaseStaleBuffer).
      const maxDuration = this.options.maxDurationMs;
      const waitedTooLong = maxDuration !== null && this.deps.clock.now() - held.claimedAtLocal >= maxDuration / 2;
      if (outcome === 'completed' && !this.stopping && !waitedTooLong) continue;
      if (outcome === 'ended') for (const follower of rest) this.forget(follower);
      else this.acker.release(rest);
      return;
    }
  }

  /** The next job for a reader; null tells the reader to retire (or that the queue stops). */
  private take(): Promise<HeldJob | null> {
    if (this.stopping) return Promise.resolve(null);
    const next = this.buffer.shift();
    this.scheduleClaim();
    if (next) return Promise.resolve(next);
    return new Promise((resolve) => {
      if (this.waiting.length === 0) this.waitingSince = this.deps.clock.now();
      this.waiting.push(resolve);
    });
  }

  // ---- the claim loop ---------------------------------------------------------------------

  /**
   * Hands buffered jobs to waiting readers, starts readers for the jobs left over (the
   * activation rule: a claimed job that no idle reader took), and schedules the next claim.
   */
  private pump(): void {
    while (this.waiting.length > 0 && this.buffer.length > 0) this.waiting.shift()!(this.buffer.shift()!);
    if (!this.stopping) {
      for (let n = readersToStart(this.readers, this.options.maxReaders, this.buffer.length); n > 0; n--) {
        this.addReader('activation');
      }
    }
    this.scheduleClaim();
  }

  private scheduleClaim(): void {
    if (this.claimScheduled || this.stopping || this.idleSleeps.size > 0) return;
    // Deferred one turn of the event loop: readers that finish in the same turn then share one
    // claim statement instead of each sending its own.
    this.claimScheduled = true;
    setImmediate(() => {
      this.claimScheduled = false;
      this.startClaims();
    });
  }

  private startClaims(): void {
    const prefetch = this.prefetchTarget();
    // With a prefetch buffer, a second claim may overlap the first, so the buffer refills
    // while readers drain it; an empty queue needs one claim at a time.
    const maxInFlight = prefetch > 0 && !this.lastClaimEmpty ? 2 : 1;
    while (!this.stopping && this.idleSleeps.size === 0 && this.claimsInFlight < maxInFlight) {
      const limit = claimSize({
        maxReaders: this.options.maxReaders,
        batchSize: this.options.batchSize,
        prefetch,
        running: this.running.size,
        buffered: this.buffer.length,
        requested: this.requested,
      });
      if (limit === 0) return;
      this.wokenDuringClaim = false;
      this.claimsInFlight++;
      this.requested += limit;
      const claiming: Promise<void> = this.claim(limit).finally(() => {
        this.claimsInFlight--;
        this.requested -= limit;
        this.claims.delete(claiming);
        this.pump();
      });
      this.claims.add(claiming);
    }
  }

  private async claim(limit: number): Promise<void> {
    const startedAt = this.deps.clock.now();
    let claimed: ClaimedJob[];
    try {
      claimed = await this.tracer.claim(this.queue, limit, () =>
        this.deps.store.claim({
          queue: this.queue,
          limit,
          leaseMs: this.options.leaseMs,
          workerId: this.deps.workerId,
          groupBatchSize: this.options.groupBatchSize,
        }),
      );
      this.claimErrors.succeeded();
      this.errorBackoffMs = ERROR_BACKOFF_MIN_MS;
    } catch (error) {
      const pause = this.errorBackoffMs;
      this.errorBackoffMs = Math.min(ERROR_BACKOFF_MAX_MS, this.errorBackoffMs * 2);
      this.claimErrors.failed(error, pause);
      await this.pause(pause);
      return;
    }
    this.lastLoopAt = this.deps.clock.now();
    this.claimMs.add(this.lastLoopAt - startedAt);
    this.lastClaimEmpty = claimed.length === 0;
    const claimedAtLocal = startedAt;
    if (this.stopping) {
      // Claimed while shutdown began: give them straight back, attempt not counted.
      const late = claimed.map((job) => this.hold(job, claimedAtLocal));
      this.acker.release(late);
      return;
    }
    if (claimed.length === 0) {
      if (this.wokenDuringClaim) {
        this.wokenDuringClaim = false;
        return;
      }
      safeEmit(this.deps.listeners, 'emptyClaim', { queue: this.queue });
      this.retireSurplusWaiters();
      await this.pause(this.pollBackoff.next());
      return;
    }
    safeEmit(this.deps.listeners, 'claimed', {
      queue: this.queue,
      count: claimed.length,
      limit,
      durationMs: this.deps.clock.now() - startedAt,
    });
    this.pollBackoff.reset();
    for (const batch of claimedUnits(claimed)) {
      const [first, ...followers] = batch.map((job) => this.hold(job, claimedAtLocal));
      first!.followers = followers;
      this.buffer.push(first!);
    }
  }

  /** Waits between claims; a wake-up or shutdown ends the wait early. */
  private async pause(ms: number): Promise<void> {
    if (this.stopping) return;
    const sleep = new AbortController();
    this.idleSleeps.add(sleep);
    try {
      await this.deps.clock.sleep(ms, sleep.signal);
    } finally {
      this.idleSleeps.delete(sleep);
      this.lastLoopAt = this.deps.clock.now();
    }
  }

  private endPauses(): void {
    for (const sleep of this.idleSleeps) sleep.abort();
  }

  /** Seed 003: a reader whose claim came back empty retires while more than the minimum run. */
  private retireSurplusWaiters(): void {
    let readers = this.readers;
    while (this.waiting.length > 0 && shouldRetireAfterEmptyClaim(readers, this.options.minReaders)) {
      this.waiting.pop()!(null);
      readers--;
    }
  }

  /** Jobs to hold ahead of the handlers: the fixed option, or the adaptive target. */
  private prefetchTarget(): number {
    const { prefetch, maxReaders, batchSize } = this.options;
    if (prefetch !== 'auto') return prefetch;
    let handlerMs = this.handlerMs.value;
    // The average learns only from finished handlers. While every slot is busy, the handler
    // that has run the shortest time so far bounds how soon a buffered job can start: when
    // jobs turn slow, the target drops at once instead of after they finish.
    if (handlerMs !== null && this.running.size >= maxReaders) {
      const now = this.deps.clock.now();
      let shortestRun = Infinity;
      for (const held of this.running.keys()) shortestRun = Math.min(shortestRun, now - (held.startedAtLocal ?? now));
      handlerMs = Math.max(handlerMs, shortestRun);
    }
    return autoPrefetch({ maxReaders, batchSize, claimMs: this.claimMs.value, handlerMs });
  }

  /**
   * Gives back (attempt not counted) buffered jobs that would only wait here: beyond what the
   * free slots and the current prefetch target need (the handlers turned slow after the buffer
   * filled), and any that waited half their maxDurationMs, which heartbeats cannot extend past
   * (it runs from the claim). Another process, or this one later, takes them.
   */
  private releaseStaleBuffer(now: number): void {
    if (this.buffer.length === 0 || this.stopping) return;
    const keep = Math.max(0, this.options.maxReaders - this.running.size) + this.prefetchTarget();
    const maxWait = this.options.maxDurationMs === null ? Infinity : this.options.maxDurationMs / 2;
    const kept: HeldJob[] = [];
    const stale: HeldJob[] = [];
    for (const [index, held] of this.buffer.entries()) {
      (index >= keep || now - held.claimedAtLocal >= maxWait ? stale : kept).push(held);
    }
    if (stale.length === 0) return;
    this.buffer.splice(0, this.buffer.length, ...kept);
    const jobs = stale.flatMap(withFollowers);
    this.deps.logger.debug?.(
      `queue '${this.queue}': gave back ${jobs.length} prefetched job(s) that handlers would not reach soon`,
    );
    this.acker.release(jobs);
  }

  // ---- running a job ----------------------------------------------------------------------

  private hold(job: ClaimedJob, claimedAtLocal: number): HeldJob {
    const held: HeldJob = {
      job,
      controller: null,
      aborted: false,
      abortReason: undefined,
      onAbort: null,
      leaseMs: this.options.leaseMs,
      claimedAtLocal,
      startedAtLocal: null,
      renewedAtLocal: claimedAtLocal,
      localLeaseUntil: claimedAtLocal + this.options.leaseMs,
      lost: false,
      timedOut: false,
      shutdownAborted: false,
      followers: [],
      recorded: null,
    };
    this.held.set(job.id, held);
    return held;
  }

  /**
   * The job's outcome is recorded. An ordered group's next job became claimable with it, but
   * a claim sent meanwhile saw the group still held and may have started an idle pause: claim
   * again now, so a group's jobs follow each other without waiting out a poll interval.
   */
  private settled(held: HeldJob, completed: boolean): void {
    held.recorded?.(completed);
    held.recorded = null;
    this.forget(held);
    if (held.job.groupKey !== null) this.wake();
  }

  /** The job leaves this worker's hands: no more heartbeats. */
  private forget(held: HeldJob): void {
    if (this.held.get(held.job.id) === held) this.held.delete(held.job.id);
  }

  private async run(held: HeldJob): Promise<RunOutcome> {
    const { job } = held;
    if (held.aborted) {
      this.forget(held); // its lease was lost or ran out while it waited
      return 'ended';
    }
    const context: JobContext = {
      jobId: job.id,
      queue: job.queue,
      attempt: job.attempt,
      maxAttempts: job.maxAttempts,
      idempotencyKey: job.idempotencyKey,
      groupKey: job.groupKey,
      schedule: parseScheduleJobKey(job.idempotencyKey),
      enqueuedAt: job.enqueuedAt,
      claimedAt: job.claimedAt,
      get signal() {
        return signalOf(held);
      },
      extendLease: (ms) => this.extendLease(held, ms),
    };
    const execution = this.execute(held, context);
    this.running.set(held, execution);
    try {
      return await execution;
    } finally {
      this.running.delete(held);
    }
  }

  private async execute(held: HeldJob, context: JobContext): Promise<RunOutcome> {
    const { job } = held;
    const startedAt = this.deps.clock.now();
    held.startedAtLocal = startedAt;
    // Each attempt is its own consumer span, in the trace of the enqueue that stored the job.
    const handled = Promise.resolve()
      .then(() => this.tracer.process(job, () => this.handler(job.payload, context)))
      .then(
        () => ({ ok: true }) as const,
        (error: unknown) => ({ ok: false, error }) as const,
      );
    // Race the handler against abandonment, which only starts once the job is aborted: a
    // handler that ignores its signal must not hold a reader forever.
    // Created only for an aborted job (most never are), and cancelled once the race settles.
    const grace: { timer?: AbortController } = {};
    const result = await new Promise<Awaited<typeof handled> | 'abandoned'>((resolve) => {
      void handled.then(resolve);
      const startGrace = () => {
        grace.timer = new AbortController();
        const ms = held.shutdownAborted ? SHUTDOWN_ABANDON_GRACE_MS : ABANDON_GRACE_MS;
        void this.deps.clock.sleep(ms, grace.timer.signal).then(() => resolve('abandoned'));
      };
      if (held.aborted) startGrace();
      else held.onAbort = startGrace;
    });
    grace.timer?.abort();
    held.onAbort = null;
    if (result === 'abandoned') {
      this.deps.logger.warn(
        `job ${job.id} in queue '${job.queue}': handler ignored its abort signal (${describeReason(held.abortReason)}); the reader moves on and the lease decides the job's fate`,
      );
      safeEmit(this.deps.listeners, 'abandoned', { queue: job.queue, jobId: job.id });
      this.forget(held);
      return 'ended';
    }
    const outcome = result;
    this.handlerMs.add(this.deps.clock.now() - startedAt);

    // Even when a heartbeat already found the lease gone, the outcome is sent: the token check
    // in the database is the arbiter, and its refusal is what gets logged and counted.
    if (outcome.ok) {
      this.acker.complete(held);
      return held.lost ? 'ended' : 'completed';
    }
    if (held.timedOut) return 'ended'; // the timeout was already recorded as this attempt's failure (and forgotten)
    if (held.shutdownAborted && !held.lost) {
      // Stopped by shutdown, not by its own fault: give the job back without using an attempt.
      this.acker.release([held]);
      return 'released';
    }
    const error = outcome.error;
    const dead = error instanceof SqlQueueUnrecoverableError;
    this.acker.fail(held, error, dead ? 0 : this.options.retryDelay(job.attempt, error), dead);
    return 'ended';
  }

  // ---- leases -----------------------------------------------------------------------------

  private async extendLease(held: HeldJob, ms?: number): Promise<void> {
    if (ms !== undefined && (typeof ms !== 'number' || !Number.isInteger(ms) || ms < 1 || ms > INT_MAX)) {
      throw new SqlQueueValidationError(
        `job ${held.job.id} in queue '${held.job.queue}': extendLease(ms) takes an integer from 1 to ${INT_MAX}, got ${String(ms)}`,
      );
    }
    if (held.lost) throw new SqlQueueLeaseLostError(held.job.queue, held.job.id);
    // Never shortens: later routine heartbeats keep the longer lease, so the extension holds.
    held.leaseMs = Math.max(held.leaseMs, ms ?? 0);
    const requestedAt = this.deps.clock.now();
    const [result] = await this.boundedHeartbeat([held]);
    if (!result || result.outcome === 'lost') {
      // Once the handler has returned, its token-checked outcome decides and reports, as in renewLeases.
      if (this.running.has(held)) this.markLost(held);
      throw new SqlQueueLeaseLostError(held.job.queue, held.job.id);
    }
    held.renewedAtLocal = requestedAt;
    held.localLeaseUntil = requestedAt + held.leaseMs;
  }

  /** One heartbeat statement, bounded so a dead connection cannot hold the lease keeper. */
  private boundedHeartbeat(helds: readonly HeldJob[]): Promise<HeartbeatResult[]> {
    return withTimeout(
      this.deps.store.heartbeat(
        helds.map((held) => ({
          id: held.job.id,
          claimToken: held.job.claimToken,
          leaseMs: held.leaseMs,
          maxDurationMs: this.options.maxDurationMs,
        })),
      ),
      Math.max(1_000, Math.floor(this.options.leaseMs / 3)),
      `renewing leases in queue '${this.queue}'`,
    );
  }

  /**
   * Every tick: enforces maxDurationMs and aborts handlers whose lease could not be confirmed
   * before it ran out (these checks never wait on the database), then sends one batch
   * heartbeat for the held jobs whose lease is a third used up, unless one is still in flight.
   */
  private async renewLeases(): Promise<void> {
    if (this.held.size === 0) return;
    const now = this.deps.clock.now();
    this.releaseStaleBuffer(now);
    const due: HeldJob[] = [];
    for (const held of this.held.values()) {
      if (held.lost || held.timedOut) continue;
      const maxDuration = this.options.maxDurationMs;
      if (maxDuration !== null && now - held.claimedAtLocal >= maxDuration && this.running.has(held)) {
        this.timeOut(held, maxDuration);
        continue;
      }
      if (now >= held.localLeaseUntil) {
        // Could not renew in time (database unreachable): another worker may own it by now.
        abortJob(
          held,
          new SqlQueueLeaseLostError(held.job.queue, held.job.id, 'the lease could not be renewed before it expired'),
        );
        if (this.dropBuffered(held)) continue;
      }
      if (now - held.renewedAtLocal >= held.leaseMs / 3) due.push(held);
    }
    if (this.heartbeatRunning || due.length === 0) return;
    this.heartbeatRunning = true;
    try {
      const requestedAt = this.deps.clock.now();
      const results = await this.boundedHeartbeat(due);
      this.heartbeatErrors.succeeded();
      const byId = new Map(results.map((r) => [r.id, r]));
      for (const held of due) {
        const result = byId.get(held.job.id);
        if (result?.outcome === 'ok') {
          held.renewedAtLocal = requestedAt;
          held.localLeaseUntil = requestedAt + held.leaseMs;
        } else if (this.held.get(held.job.id) === held && (this.running.has(held) || held.startedAtLocal === null)) {
          // Only a job still running or waiting (buffered, or later in a group batch) can lose
          // its lease here. Once its handler has returned, its outcome is in flight, and that
          // token-checked write ('ok', 'already' or 'lost') decides and reports, not a renewal
          // racing it.
          this.markLost(held);
        }
      }
    } catch (error) {
      this.heartbeatErrors.failed(error, Math.floor(this.options.leaseMs / 6));
    } finally {
      this.heartbeatRunning = false;
    }
  }

  private markLost(held: HeldJob): void {
    if (held.lost) return;
    held.lost = true;
    const error = new SqlQueueLeaseLostError(held.job.queue, held.job.id);
    this.deps.logger.warn(`${error.message}; aborting its handler`);
    safeEmit(this.deps.listeners, 'lostOwnership', {
      queue: held.job.queue,
      jobId: held.job.id,
      during: 'heartbeat',
      outcome: 'lost',
    });
    abortJob(held, error);
    if (!this.dropBuffered(held) && !this.running.has(held)) this.forget(held);
  }

  /**
   * Takes a job that has not started out of the buffer and out of this worker's hands, with the
   * rest of its group batch: they share its claim token, so they are lost with it.
   */
  private dropBuffered(held: HeldJob): boolean {
    const index = this.buffer.indexOf(held);
    if (index < 0) return false;
    this.buffer.splice(index, 1);
    for (const job of withFollowers(held)) this.forget(job);
    return true;
  }

  /** maxDurationMs passed: record the failure now (token-checked) and abort the handler. */
  private timeOut(held: HeldJob, maxDurationMs: number): void {
    held.timedOut = true;
    const error = new SqlQueueJobTimeoutError(held.job.queue, held.job.id, maxDurationMs);
    this.deps.logger.warn(`${error.message}; aborting its handler and recording the attempt as failed`);
    abortJob(held, error);
    this.acker.fail(held, error, this.options.retryDelay(held.job.attempt, error), false);
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
    this.stopping = true;
    this.beginStopping();
    this.endPauses();
    while (this.waiting.length > 0) this.waiting.shift()!(null);
    const released = this.buffer.splice(0).flatMap(withFollowers);
    this.acker.release(released);

    // Claims already sent: wait for them (bounded), so the jobs they bring back are given back
    // now, before connections close, instead of staying leased until their lease runs out.
    if (!(await settleWithin(Promise.all([...this.claims]), timeoutMs + SHUTDOWN_ABANDON_GRACE_MS))) {
      this.deps.logger.warn(
        `queue '${this.queue}': a claim was still in flight at shutdown (database unresponsive?); jobs it leased come back when their lease expires`,
      );
    }
    const runningAtStop = this.running.size;
    const allDone = () => Promise.all([...this.running.values()]).then(() => undefined);
    const deadline = new AbortController();
    const finishedInTime = await Promise.race([
      allDone().then(() => true),
      this.deps.clock.sleep(timeoutMs, deadline.signal).then(() => false),
    ]);
    deadline.abort();
    let aborted = 0;
    if (!finishedInTime) {
      for (const held of this.running.keys()) {
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

/**
 * How a job's run ended, for the batch it belongs to: `completed` (its completion is on its
 * way), `released` (given back unstarted or stopped by shutdown), `ended` (failed, timed out,
 * lost or abandoned: its batch siblings come back through the database, not from here).
 */
type RunOutcome = 'completed' | 'released' | 'ended';

/**
 * Claimed jobs as units of work: an ordered group's batch (jobs sharing a group key and a claim
 * token) in id order, every other job on its own.
 */
function claimedUnits(claimed: readonly ClaimedJob[]): ClaimedJob[][] {
  const units: ClaimedJob[][] = [];
  const batches = new Map<string, ClaimedJob[]>();
  for (const job of claimed) {
    if (job.groupKey === null) {
      units.push([job]);
      continue;
    }
    const batch = batches.get(job.claimToken);
    if (batch) batch.push(job);
    else {
      const unit = [job];
      batches.set(job.claimToken, unit);
      units.push(unit);
    }
  }
  for (const batch of batches.values()) {
    if (batch.length > 1) batch.sort((a, b) => (BigInt(a.id) < BigInt(b.id) ? -1 : 1));
  }
  return units;
}

function describeReason(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}
