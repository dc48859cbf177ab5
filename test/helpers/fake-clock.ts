import type { Clock } from '../../lib/src/core/clock.js';

/**
 * A clock that moves only when the test says so. Timers fire in time order during advance(),
 * and pending promise callbacks get to run between them, so engine loops behave as in real
 * time without a test ever sleeping.
 */
export class FakeClock implements Clock {
  private time = 0;
  private seq = 0;
  private timers: { at: number; seq: number; fire: () => void; every?: number }[] = [];

  now(): number {
    return this.time;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal?.aborted) return resolve();
      const timer = { at: this.time + ms, seq: this.seq++, fire: () => resolve() };
      this.timers.push(timer);
      signal?.addEventListener(
        'abort',
        () => {
          this.timers = this.timers.filter((t) => t !== timer);
          resolve();
        },
        { once: true },
      );
    });
  }

  setInterval(callback: () => void, ms: number): { cancel(): void } {
    const timer = { at: this.time + ms, seq: this.seq++, fire: callback, every: ms };
    this.timers.push(timer);
    return { cancel: () => (this.timers = this.timers.filter((t) => t !== timer)) };
  }

  /** Moves time forward by `ms`, firing due timers in order and settling promises between them. */
  async advance(ms: number): Promise<void> {
    const end = this.time + ms;
    await settle();
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at || a.seq - b.seq);
      const next = this.timers[0];
      if (!next || next.at > end) break;
      this.time = next.at;
      if (next.every) next.at += next.every;
      else this.timers.shift();
      next.fire();
      await settle();
    }
    this.time = end;
    await settle();
  }
}

/** Lets queued promise callbacks and setImmediate work run to completion. */
export async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}
