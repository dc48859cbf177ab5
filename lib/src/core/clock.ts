/**
 * The engine's own sense of time, for its timers only (poll backoff, heartbeats, activation).
 * Stored times always come from the database clock. Tests pass a fake clock and never sleep.
 */
export interface Clock {
  now(): number;
  /** Resolves after `ms`, or early (without error) when `signal` aborts. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
  setInterval(callback: () => void, ms: number): { cancel(): void };
}

export const systemClock: Clock = {
  now: () => Date.now(),
  sleep(ms, signal) {
    return new Promise((resolve) => {
      if (signal?.aborted) return resolve();
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        resolve();
      }
      signal?.addEventListener('abort', done, { once: true });
    });
  },
  setInterval(callback, ms) {
    const timer = setInterval(callback, ms);
    timer.unref?.();
    return { cancel: () => clearInterval(timer) };
  },
};
