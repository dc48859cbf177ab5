import { SqlQueueConfigError } from '../errors.js';
import { assertInteger, assertOptionGroup, INT_MAX } from '../validation.js';

/**
 * What the database says of one queue, for its scale recommendation. The store reads it in one
 * statement; the SQL function migrations install (`desired_readers`, `DesiredReaders`) reads the same
 * and applies the same rule (`desiredReaders` below), so KEDA's SQL scalers, the Prometheus gauge
 * and SqlQueueMetrics agree.
 */
export interface ScaleInputs {
  /**
   * Jobs a claim could take now: due, in a queue not paused, and not held back (a job of an
   * ordered group behind its head or in a blocked group, a keyed job whose key is at its
   * concurrencyPerKey).
   */
  claimable: number;
  /** Jobs leased now, on every worker. */
  running: number;
  /** Jobs completed within the sample window (the throughput table's last whole minutes). */
  completedInWindow: number;
  /** Milliseconds those jobs took from claim to done, summed (their handlers' run). */
  busyMsInWindow: number;
  /** The sample window's length. */
  windowMs: number;
  /** Paused (`pauseQueue`): its running jobs keep their readers, nothing more is asked for. */
  paused: boolean;
  /** The queue's recorded flow limits; null where none is set. */
  globalConcurrency: number | null;
  rateMax: number | null;
  ratePerMs: number | null;
}

/** How a queue is scaled: how fast its backlog should drain. */
export interface ScalePolicy {
  /** Readers are asked for so that the claimable backlog would drain in about this long (default 60 s). */
  targetDrainMs?: number;
  /** A handler's run time assumed before any has been measured (default 1 s). */
  defaultRunMs?: number;
  /** A lower recommendation is followed only once it has held this long (default 5 minutes). */
  scaleDownDelayMs?: number;
}

export type ResolvedScalePolicy = Required<ScalePolicy>;

export const DEFAULT_SCALE_POLICY: ResolvedScalePolicy = {
  targetDrainMs: 60_000,
  defaultRunMs: 1_000,
  scaleDownDelayMs: 300_000,
};

/** The sample window of the completion rate: the throughput table's five whole minutes before the current one. */
export const SCALE_WINDOW_MINUTES = 5;

export function resolveScalePolicy(raw: ScalePolicy | undefined, where = 'scaling'): ResolvedScalePolicy {
  const value = assertOptionGroup(where, raw, ['targetDrainMs', 'defaultRunMs', 'scaleDownDelayMs']);
  const field = (name: keyof ScalePolicy, min: number) =>
    value[name] === undefined
      ? DEFAULT_SCALE_POLICY[name]
      : assertInteger(`${where}.${name}`, value[name], min, INT_MAX, SqlQueueConfigError);
  return {
    targetDrainMs: field('targetDrainMs', 1_000),
    defaultRunMs: field('defaultRunMs', 1),
    scaleDownDelayMs: field('scaleDownDelayMs', 0),
  };
}

/** ⌈a / b⌉ for b > 0, exact on integers of any size (the SQL functions compute it on numerics alike). */
function ceilDiv(a: bigint, b: bigint): bigint {
  return a <= 0n ? 0n : (a + b - 1n) / b;
}

/** A measured run time is taken as at most a day (a stuck measurement must not ask for millions of readers). */
export const MAX_MEASURED_RUN_MS = 86_400_000;

/** The most readers the rule gives (an int in both databases' answers). */
const MAX_READERS = 2_147_483_647n;

/**
 * Readers the queue needs now, across every pod:
 * - the run time T is the measured one (busy time ÷ completions over the window, rounded up to a
 *   millisecond, at most a day), else `defaultRunMs`;
 * - the steady load is the readers that were busy on average over the window (⌈busy ÷ window⌉,
 *   Little's law with measured durations), and the backlog asks for ⌈claimable × T ÷ targetDrainMs⌉
 *   more, so it drains in about targetDrainMs; never fewer than the jobs running now (their readers
 *   are taken). The average lags a burst by design: readers added for a backlog show in it only as
 *   they work, and the backlog they drain leaves the second term, so nothing is counted twice;
 * - capped by the queue's globalConcurrency, and by what its rate limit lets run at T
 *   (⌈rateMax × T ÷ ratePerMs⌉);
 * - at least 1 while work is claimable (scale from zero); 0 for an idle queue (scale to zero); a
 *   paused queue keeps only its running jobs' readers.
 * Integer arithmetic throughout, at most 2^31 - 1, so the SQL functions (numeric on PostgreSQL,
 * bigint on SQL Server) give the same number to the job.
 */
export function desiredReaders(inputs: ScaleInputs, policy: ResolvedScalePolicy = DEFAULT_SCALE_POLICY): number {
  const whole = (value: number) => BigInt(Math.max(0, Math.trunc(value)));
  const claimable = whole(inputs.claimable);
  const running = whole(inputs.running);
  const cap = (value: bigint) => Number(value > MAX_READERS ? MAX_READERS : value);
  if (inputs.paused) return cap(running);
  if (claimable === 0n && running === 0n) return 0;
  const completed = whole(inputs.completedInWindow);
  const busy = whole(inputs.busyMsInWindow);
  const windowMs = whole(inputs.windowMs) > 0n ? whole(inputs.windowMs) : 1n;
  let runMs = BigInt(policy.defaultRunMs);
  if (completed > 0n && busy > 0n) {
    runMs = ceilDiv(busy, completed);
    if (runMs > BigInt(MAX_MEASURED_RUN_MS)) runMs = BigInt(MAX_MEASURED_RUN_MS);
  }
  let readers = ceilDiv(busy, windowMs) + ceilDiv(claimable * runMs, BigInt(policy.targetDrainMs));
  if (readers < running) readers = running;
  if (inputs.globalConcurrency !== null) {
    const limit = BigInt(inputs.globalConcurrency);
    if (readers > limit) readers = limit;
  }
  if (inputs.rateMax !== null && inputs.ratePerMs !== null && inputs.ratePerMs > 0) {
    const limit = ceilDiv(BigInt(inputs.rateMax) * runMs, BigInt(inputs.ratePerMs));
    if (readers > limit) readers = limit;
  }
  if (claimable > 0n && readers < 1n) readers = 1n;
  return cap(readers);
}

/** Pods for `readers`, at `maxReaders` each (what KEDA computes with targetValue = maxReaders). */
export function desiredWorkers(readers: number, maxReaders: number): number {
  return readers <= 0 ? 0 : Math.ceil(readers / Math.max(1, maxReaders));
}

/**
 * The recommendation over time, without flapping: a higher value is followed at once, a lower one
 * only once it has held for `scaleDownDelayMs` (the highest value of that last stretch is the one
 * given), as Kubernetes' HPA stabilizes its scale-down. A load that oscillates gets its peak, a spike
 * holds for the delay, and a steady load gets exactly its value.
 */
export class ScaleRecommender {
  private readonly samples: { at: number; readers: number }[] = [];

  constructor(private readonly scaleDownDelayMs: number = DEFAULT_SCALE_POLICY.scaleDownDelayMs) {}

  /** Records the instantaneous value at `now` (ms, any monotonic clock) and returns the recommendation. */
  observe(now: number, readers: number): number {
    this.samples.push({ at: now, readers });
    while (this.samples.length > 1 && this.samples[0]!.at < now - this.scaleDownDelayMs) this.samples.shift();
    return Math.max(...this.samples.map((sample) => sample.readers));
  }
}
