import type { ClaimedJob } from '../types.js';

/** A job this process holds a lease on, from claim until its outcome is recorded. */
export interface HeldJob {
  job: ClaimedJob;
  /** Created on first use of `context.signal`: most handlers never look at it. */
  controller: AbortController | null;
  aborted: boolean;
  abortReason: unknown;
  /** Set while the handler runs: starts the grace period after which a deaf handler is abandoned. */
  onAbort: (() => void) | null;
  /** Lease length this job's heartbeats ask for: the queue's, or longer after extendLease(). */
  leaseMs: number;
  /** Engine clock when the claim was sent: a lower bound for the lease's start. */
  claimedAtLocal: number;
  /** Engine clock when its handler started; null while it waits in the prefetch buffer. */
  startedAtLocal: number | null;
  renewedAtLocal: number;
  /** Conservative local estimate of when the lease ends if not renewed. */
  localLeaseUntil: number;
  /** A heartbeat found the token gone. */
  lost: boolean;
  timedOut: boolean;
  /** cancel() reached it (a heartbeat said so): its cancellation is recorded, its handler aborted. */
  canceled: boolean;
  /** The last progress its handler reported that is not written yet (JSON text), or null. */
  pendingProgress: string | null;
  /** `context.rateLimited(ms)` was called: the job is given back for this long, whatever the handler does. */
  postponeMs: number | null;
  shutdownAborted: boolean;
  /**
   * Its completion is being recorded in its handler's transaction: the row is locked until the
   * commit, so heartbeats leave it out (a renewal would wait on that lock, and every renewal in
   * its batch with it).
   */
  committing: boolean;
  /**
   * Its handler's transaction holds the store's only session (PGlite): its lease cannot be renewed
   * until it ends and nobody can take the job meanwhile, so the lease is not expired locally.
   */
  holdsSession: boolean;
  /**
   * The rest of an ordered group's batch (same claim token), run after this job, in order, by
   * the same reader; empty for any other job.
   */
  followers: HeldJob[];
  /**
   * Set on a job of a group batch that others follow: told when its outcome is recorded, true
   * when that was its completion ('ok' or 'already'), so the next job of the group starts only
   * once this one is done in the database.
   */
  recorded: ((completed: boolean) => void) | null;
}

/** A buffered job and the group batch it heads: what a reader takes, and what is given back together. */
export function withFollowers(held: HeldJob): HeldJob[] {
  return held.followers.length === 0 ? [held] : [held, ...held.followers];
}

/** The job's abort signal, created on demand (already aborted if the job was). */
export function signalOf(held: HeldJob): AbortSignal {
  if (!held.controller) {
    held.controller = new AbortController();
    if (held.aborted) held.controller.abort(held.abortReason);
  }
  return held.controller.signal;
}

/** Aborts a job's handler once: the signal fires and the abandon grace period starts. */
export function abortJob(held: HeldJob, reason: unknown): void {
  if (held.aborted) return;
  held.aborted = true;
  held.abortReason = reason;
  held.controller?.abort(reason);
  held.onAbort?.();
}

/**
 * The jobs this process holds a lease on, by id, and the handlers running among them. A job
 * enters when a claim returns it and leaves when its outcome is recorded, its lease is lost, or it
 * is given back; while held, the lease keeper renews it.
 */
export class HeldJobs {
  private readonly byId = new Map<string, HeldJob>();
  /** Keyed by the hold, not the job id: a job re-claimed here while its old run ends is a new entry. */
  readonly running = new Map<HeldJob, Promise<unknown>>();

  constructor(private readonly leaseMs: number) {}

  get size(): number {
    return this.byId.size;
  }

  values(): IterableIterator<HeldJob> {
    return this.byId.values();
  }

  hold(job: ClaimedJob, claimedAtLocal: number): HeldJob {
    const held: HeldJob = {
      job,
      controller: null,
      aborted: false,
      abortReason: undefined,
      onAbort: null,
      leaseMs: this.leaseMs,
      claimedAtLocal,
      startedAtLocal: null,
      renewedAtLocal: claimedAtLocal,
      localLeaseUntil: claimedAtLocal + this.leaseMs,
      lost: false,
      timedOut: false,
      canceled: false,
      pendingProgress: null,
      postponeMs: null,
      shutdownAborted: false,
      committing: false,
      holdsSession: false,
      followers: [],
      recorded: null,
    };
    this.byId.set(job.id, held);
    return held;
  }

  /** This hold is still the one for its job (not forgotten, not replaced by a new claim of it). */
  holds(held: HeldJob): boolean {
    return this.byId.get(held.job.id) === held;
  }

  /** The job leaves this worker's hands: no more heartbeats. */
  forget(held: HeldJob): void {
    if (this.holds(held)) this.byId.delete(held.job.id);
  }
}
