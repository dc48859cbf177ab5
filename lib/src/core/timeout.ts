import { SqlQueueError } from './errors.js';

/** A statement (or any work) that did not settle within its bound. */
export class SqlQueueTimeoutError extends SqlQueueError {}

/**
 * Rejects after `ms` if the work has not settled; the work itself is left to finish or fail
 * (its late result is ignored). Used wherever a hung connection must not stall the engine.
 */
export async function withTimeout<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new SqlQueueTimeoutError(`${what} timed out after ${ms} ms`)), ms);
    timer.unref?.();
  });
  // The work may still reject after the timeout won: that rejection is expected, not unhandled.
  work.catch(() => undefined);
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits for `work` at most `ms`; resolves either way (for shutdown steps that must not hang). */
export async function settleWithin(work: Promise<unknown>, ms: number): Promise<boolean> {
  try {
    await withTimeout(work, Math.max(0, ms), 'shutdown step');
    return true;
  } catch {
    return false;
  }
}
