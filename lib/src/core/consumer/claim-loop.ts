import { PollBackoff } from '../backoff.js';
import { safeEmit } from '../events.js';
import { ThrottledErrorLog } from '../logger.js';
import type { ResolvedQueueOptions } from '../options.js';
import type { QueueTracer } from '../tracing.js';
import type { ClaimedJob } from '../types.js';
import { autoPrefetch, claimSize, MovingAverage } from './activation.js';
import { withFollowers, type HeldJob, type HeldJobs } from './held-jobs.js';
import type { AckerDeps, JobAcker } from './job-acker.js';

const ERROR_BACKOFF_MIN_MS = 100;
const ERROR_BACKOFF_MAX_MS = 5_000;

/** What the claim loop tells the consumer around it, and asks of it. */
export interface ClaimLoopHost {
  stopping(): boolean;
  /** A claim ended (with jobs, empty or failed): hand the buffer out and claim again if needed. */
  claimEnded(): void;
  /** A claim came back empty and unwoken: readers above the minimum may retire. */
  emptyClaim(): void;
}

/**
 * The claim side of a queue's consumer: claims sized to the free handler slots plus a prefetch
 * target (fixed, or learned from claim and handler times), deferred a turn so readers finishing
 * together share one statement, at most two in flight while a buffer is kept, one after an empty
 * claim; idle pauses that grow after empty claims and end on a wake-up; error backoff; and the
 * buffer of claimed jobs not started yet, given back when handlers would not reach them soon.
 */
export class ClaimLoop {
  /** Claimed jobs not started yet, each heading its group batch (if any). */
  readonly buffer: HeldJob[] = [];
  /** Claim statements in flight, and how many jobs they asked for. */
  private claimsInFlight = 0;
  private requested = 0;
  private claimScheduled = false;
  /** Claims in flight, awaited by shutdown so that what they return is given back. */
  private readonly claims = new Set<Promise<void>>();
  private wokenDuringClaim = false;
  /** The claim loop's pauses (two claims may overlap, so two may pause); aborting them wakes it. */
  private readonly idleSleeps = new Set<AbortController>();
  /** After an empty claim one claim at a time is enough, even with a prefetch buffer. */
  private lastClaimEmpty = false;
  /** Recent claim round trips, for `prefetch: 'auto'`. */
  private readonly claimMs = new MovingAverage();
  private lastLoop: number;
  private readonly pollBackoff: PollBackoff;
  private errorBackoffMs = ERROR_BACKOFF_MIN_MS;
  private readonly errors: ThrottledErrorLog;

  constructor(
    private readonly deps: AckerDeps & { random?: () => number },
    private readonly options: ResolvedQueueOptions,
    private readonly jobs: HeldJobs,
    private readonly acker: JobAcker,
    private readonly tracer: QueueTracer,
    /** Handler run times, for `prefetch: 'auto'`. */
    private readonly handlerMs: MovingAverage,
    private readonly host: ClaimLoopHost,
  ) {
    this.pollBackoff = new PollBackoff(options.minPollMs, options.maxPollMs, deps.random ?? Math.random);
    this.lastLoop = deps.clock.now();
    this.errors = new ThrottledErrorLog(deps.logger, `claiming from queue '${options.queue}'`, () => deps.clock.now());
  }

  /** Engine clock time the loop last made progress (claimed, slept, or failed and backed off). */
  get lastLoopAt(): number {
    return this.lastLoop;
  }

  /** True while claims fail (database unreachable, …). */
  get failing(): boolean {
    return this.errors.failing;
  }

  /** Claims in flight (shutdown waits for them and gives back what they bring). */
  inFlight(): Promise<void>[] {
    return [...this.claims];
  }

  /** New work may be there: the idle pause ends and the next claim goes at once. */
  wake(): void {
    this.pollBackoff.reset();
    // A claim already in flight may have looked before the new job committed: if it comes
    // back empty, claim again at once instead of pausing.
    if (this.claimsInFlight > 0) this.wokenDuringClaim = true;
    this.endPauses();
  }

  endPauses(): void {
    for (const sleep of this.idleSleeps) sleep.abort();
  }

  schedule(): void {
    if (this.claimScheduled || this.host.stopping() || this.idleSleeps.size > 0) return;
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
    while (!this.host.stopping() && this.idleSleeps.size === 0 && this.claimsInFlight < maxInFlight) {
      const limit = claimSize({
        maxReaders: this.options.maxReaders,
        batchSize: this.options.batchSize,
        prefetch,
        running: this.jobs.running.size,
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
        this.host.claimEnded();
      });
      this.claims.add(claiming);
    }
  }

  private async claim(limit: number): Promise<void> {
    const startedAt = this.deps.clock.now();
    let claimed: ClaimedJob[];
    try {
      claimed = await this.tracer.claim(this.options.queue, limit, () =>
        this.deps.store.claim({
          queue: this.options.queue,
          limit,
          leaseMs: this.options.leaseMs,
          workerId: this.deps.workerId,
          groupBatchSize: this.options.groupBatchSize,
          limited: this.options.limits !== null,
        }),
      );
      this.errors.succeeded();
      this.errorBackoffMs = ERROR_BACKOFF_MIN_MS;
    } catch (error) {
      const pause = this.errorBackoffMs;
      this.errorBackoffMs = Math.min(ERROR_BACKOFF_MAX_MS, this.errorBackoffMs * 2);
      this.errors.failed(error, pause);
      await this.pause(pause);
      return;
    }
    this.lastLoop = this.deps.clock.now();
    this.claimMs.add(this.lastLoop - startedAt);
    this.lastClaimEmpty = claimed.length === 0;
    const claimedAtLocal = startedAt;
    if (this.host.stopping()) {
      // Claimed while shutdown began: give them straight back, attempt not counted.
      const late = claimed.map((job) => this.jobs.hold(job, claimedAtLocal));
      this.acker.release(late);
      return;
    }
    if (claimed.length === 0) {
      if (this.wokenDuringClaim) {
        this.wokenDuringClaim = false;
        return;
      }
      safeEmit(this.deps.listeners, 'emptyClaim', { queue: this.options.queue });
      this.host.emptyClaim();
      // A full rate window frees at a known time: the next claim goes then, not a poll later.
      const hint = this.deps.store.claimRetryHintMs?.(this.options.queue) ?? null;
      const backoff = this.pollBackoff.next();
      await this.pause(hint === null ? backoff : Math.min(backoff, Math.max(hint, this.options.minPollMs)));
      return;
    }
    safeEmit(this.deps.listeners, 'claimed', {
      queue: this.options.queue,
      count: claimed.length,
      limit,
      durationMs: this.deps.clock.now() - startedAt,
    });
    this.pollBackoff.reset();
    for (const batch of claimedUnits(claimed)) {
      const [first, ...followers] = batch.map((job) => this.jobs.hold(job, claimedAtLocal));
      first!.followers = followers;
      this.buffer.push(first!);
    }
  }

  /** Waits between claims; a wake-up or shutdown ends the wait early. */
  private async pause(ms: number): Promise<void> {
    if (this.host.stopping()) return;
    const sleep = new AbortController();
    this.idleSleeps.add(sleep);
    try {
      await this.deps.clock.sleep(ms, sleep.signal);
    } finally {
      this.idleSleeps.delete(sleep);
      this.lastLoop = this.deps.clock.now();
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
    if (handlerMs !== null && this.jobs.running.size >= maxReaders) {
      const now = this.deps.clock.now();
      let shortestRun = Infinity;
      for (const held of this.jobs.running.keys()) {
        shortestRun = Math.min(shortestRun, now - (held.startedAtLocal ?? now));
      }
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
  releaseStale(now: number): void {
    if (this.buffer.length === 0 || this.host.stopping()) return;
    const keep = Math.max(0, this.options.maxReaders - this.jobs.running.size) + this.prefetchTarget();
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
      `queue '${this.options.queue}': gave back ${jobs.length} prefetched job(s) that handlers would not reach soon`,
    );
    this.acker.release(jobs);
  }

  /**
   * Takes a job that has not started out of the buffer and out of this worker's hands, with the
   * rest of its group batch: they share its claim token, so they are lost with it.
   */
  dropBuffered(held: HeldJob): boolean {
    const index = this.buffer.indexOf(held);
    if (index < 0) return false;
    this.buffer.splice(index, 1);
    for (const job of withFollowers(held)) this.jobs.forget(job);
    return true;
  }
}

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
