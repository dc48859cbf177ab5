/**
 * Seed 003's activation rule, applied to table-queue readers. Service Broker starts a reader
 * when the queue holds unread messages, no session is waiting in RECEIVE, and no RECEIVE came
 * back empty for a few seconds: readers are not keeping up. RECEIVE returns at once while
 * messages exist, so a session that "waits" is one with nothing to receive.
 *
 * Here the claim loop is the RECEIVE, and it sees its readers directly instead of inferring
 * them: a job it claimed is work in hand, and a reader that waits for a claim in flight is
 * receiving, not idle. So a claim asks for every free handler slot, a claimed job that no idle
 * reader takes gets a new reader at once (never above maxReaders), and a reader whose claim
 * comes back empty retires while more than minReaders run. Because readers follow claimed
 * jobs rather than row counts, a claim that can take only one job of a backlog (as an ordered
 * group's will) starts one reader for it, not one per row.
 */

/** Readers to start for claimed jobs that no idle reader took, never above maxReaders. */
export function readersToStart(readers: number, maxReaders: number, unassignedJobs: number): number {
  return Math.max(0, Math.min(maxReaders - readers, unassignedJobs));
}

/** A reader whose claim came back empty retires while more than the minimum run. */
export function shouldRetireAfterEmptyClaim(readers: number, minReaders: number): boolean {
  return readers > minReaders;
}

export interface ClaimSizeInput {
  maxReaders: number;
  batchSize: number;
  /** Jobs to hold ahead of the handlers (the fixed option, or the adaptive target). */
  prefetch: number;
  /** Handlers running now. */
  running: number;
  /** Claimed jobs not handed to a reader yet. */
  buffered: number;
  /** Jobs asked for by claims still in flight. */
  requested: number;
}

/**
 * How many jobs the next claim asks for; 0 means no claim now. Free handler slots plus the
 * prefetch target, less what is already in hand or asked for, at most batchSize. Once every
 * slot is covered, a prefetch buffer is topped up only when it is half empty, so it refills in
 * batches rather than one job per completion.
 */
export function claimSize(input: ClaimSizeInput): number {
  const inHand = input.running + input.buffered + input.requested;
  const freeSlots = input.maxReaders - inHand;
  const size = Math.min(input.batchSize, freeSlots + input.prefetch);
  if (size <= 0) return 0;
  if (freeSlots <= 0 && input.buffered + input.requested > input.prefetch / 2) return 0;
  return size;
}

export interface AutoPrefetchInput {
  maxReaders: number;
  batchSize: number;
  /** Recent claim round trip (ms), null before the first claim returned. */
  claimMs: number | null;
  /** Recent handler run time (ms), null before the first handler finished. */
  handlerMs: number | null;
}

/** Handler times below this count as this long: a no-op handler is not infinitely fast. */
const MIN_HANDLER_MS = 0.01;

/**
 * `prefetch: 'auto'`: enough jobs in hand for the handlers to stay busy through two claim round
 * trips (the claim in flight and the next), at most two claims' worth (2 × batchSize). Short
 * jobs get a buffer that hides the claim latency and lets two claims overlap; jobs that run long
 * against a claim get none, so no job waits leased in this process while another process has a
 * free reader.
 */
export function autoPrefetch(input: AutoPrefetchInput): number {
  if (input.claimMs === null || input.handlerMs === null) return 0;
  const jobsPerClaimTrip = (input.maxReaders * input.claimMs) / Math.max(input.handlerMs, MIN_HANDLER_MS);
  return Math.min(2 * input.batchSize, Math.round(2 * jobsPerClaimTrip));
}

/** An exponentially weighted moving average; null until the first sample. */
export class MovingAverage {
  private current: number | null = null;

  constructor(private readonly weight = 0.2) {}

  get value(): number | null {
    return this.current;
  }

  add(sample: number): void {
    this.current = this.current === null ? sample : this.current + this.weight * (sample - this.current);
  }
}
