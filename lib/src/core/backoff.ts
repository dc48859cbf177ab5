import { SqlQueueConfigError } from './errors.js';
import { assertInteger, describe, INT_MAX as MAX_DELAY_MS } from './validation.js';

/** How long to wait before the next attempt of a failed job. */
export type BackoffOption =
  /** `baseMs * factor^(attempt-1)`, capped at `maxMs`, with jitter (default 'equal'). */
  | { type: 'exponential'; baseMs?: number; factor?: number; maxMs?: number; jitter?: 'none' | 'equal' | 'full' }
  | { type: 'fixed'; delayMs: number }
  /** Custom: gets the attempt that failed (1-based) and its error; returns milliseconds. */
  | ((attempt: number, error: unknown) => number);

export type RetryDelay = (attempt: number, error: unknown) => number;

export const DEFAULT_BACKOFF: BackoffOption = { type: 'exponential', baseMs: 1_000, factor: 2, maxMs: 3_600_000 };

/** Validates a backoff option once, at boot, and returns the function the engine calls. */
export function retryDelayFor(
  option: BackoffOption | undefined,
  where: string,
  random: () => number = Math.random,
): RetryDelay {
  const backoff = option ?? DEFAULT_BACKOFF;
  if (typeof backoff === 'function') {
    return (attempt, error) => {
      let value: number;
      try {
        value = backoff(attempt, error);
      } catch {
        value = Number.NaN;
      }
      // A custom policy that throws or returns garbage must not lose the job: fall back to the default.
      return Number.isFinite(value) && value >= 0
        ? Math.min(Math.round(value), MAX_DELAY_MS)
        : defaultDelay(attempt, random);
    };
  }
  if (backoff?.type === 'fixed') {
    const delay = assertInteger(`${where}.backoff.delayMs`, backoff.delayMs, 0, MAX_DELAY_MS);
    return () => delay;
  }
  if (backoff?.type === 'exponential') {
    const base = assertInteger(`${where}.backoff.baseMs`, backoff.baseMs ?? 1_000, 0, MAX_DELAY_MS);
    const max = assertInteger(`${where}.backoff.maxMs`, backoff.maxMs ?? 3_600_000, base, MAX_DELAY_MS);
    const factor = backoff.factor ?? 2;
    if (typeof factor !== 'number' || !(factor >= 1 && factor <= 100)) {
      throw new SqlQueueConfigError(`${where}.backoff.factor must be a number from 1 to 100, got ${describe(factor)}`);
    }
    const jitter = backoff.jitter ?? 'equal';
    if (!['none', 'equal', 'full'].includes(jitter)) {
      throw new SqlQueueConfigError(
        `${where}.backoff.jitter must be 'none', 'equal' or 'full', got ${describe(jitter)}`,
      );
    }
    return (attempt) => withJitter(Math.min(max, base * factor ** Math.max(0, attempt - 1)), jitter, random);
  }
  throw new SqlQueueConfigError(
    `${where}.backoff must be { type: 'exponential', … }, { type: 'fixed', delayMs } or a function, got ${describe(backoff)}`,
  );
}

function defaultDelay(attempt: number, random: () => number): number {
  return withJitter(Math.min(3_600_000, 1_000 * 2 ** Math.max(0, attempt - 1)), 'equal', random);
}

/**
 * Equal jitter keeps at least half the delay (so retries still back off) while spreading a
 * burst of failures; full jitter spreads most but may retry at once.
 */
export function withJitter(delay: number, jitter: 'none' | 'equal' | 'full', random: () => number): number {
  if (jitter === 'none') return Math.round(delay);
  if (jitter === 'full') return Math.round(random() * delay);
  return Math.round(delay / 2 + random() * (delay / 2));
}

/**
 * Pause between empty claims: doubles from `minMs` up to `maxMs`, with up to 25% jitter added
 * (never subtracted, and never past `maxMs`), and resets as soon as work is found or a wake-up
 * arrives. So an idle reader never claims more often than once per `minMs`, and settles at
 * one claim per `maxMs`: the bound the failure drills assert.
 */
export class PollBackoff {
  private nominal: number;

  constructor(
    private readonly minMs: number,
    private readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {
    this.nominal = minMs;
  }

  next(): number {
    const delay = Math.min(this.maxMs, Math.round(this.nominal * (1 + 0.25 * this.random())));
    this.nominal = Math.min(this.maxMs, this.nominal * 2);
    return delay;
  }

  reset(): void {
    this.nominal = this.minMs;
  }
}
