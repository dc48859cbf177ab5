import { describe, expect, it } from 'vitest';
import { PollBackoff, retryDelayFor, withJitter } from '../../lib/src/core/backoff.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';

const fixedRandom = (value: number) => () => value;

describe('retry backoff', () => {
  it('defaults to exponential from 1 s doubling to 1 h, with equal jitter (half to all of the delay)', () => {
    const low = retryDelayFor(undefined, 'q', fixedRandom(0));
    const high = retryDelayFor(undefined, 'q', fixedRandom(1));
    expect([1, 2, 3, 4].map((a) => low(a, null))).toEqual([500, 1_000, 2_000, 4_000]);
    expect([1, 2, 3, 4].map((a) => high(a, null))).toEqual([1_000, 2_000, 4_000, 8_000]);
    expect(high(30, null)).toBe(3_600_000);
    expect(low(30, null)).toBe(1_800_000);
  });

  it('supports fixed delays, jitter choices and custom functions', () => {
    expect(retryDelayFor({ type: 'fixed', delayMs: 250 }, 'q')(7, null)).toBe(250);
    const noJitter = retryDelayFor({ type: 'exponential', baseMs: 100, factor: 3, maxMs: 1_000, jitter: 'none' }, 'q');
    expect([1, 2, 3, 4].map((a) => noJitter(a, null))).toEqual([100, 300, 900, 1_000]);
    const full = retryDelayFor({ type: 'exponential', baseMs: 100, jitter: 'full' }, 'q', fixedRandom(0));
    expect(full(3, null)).toBe(0);
    const custom = retryDelayFor((attempt, error) => (error === 'slow' ? 60_000 : attempt * 10), 'q');
    expect(custom(3, 'fast')).toBe(30);
    expect(custom(3, 'slow')).toBe(60_000);
  });

  it('falls back to the default when a custom policy returns nonsense, never losing the job', () => {
    const broken = retryDelayFor(() => Number.NaN, 'q', fixedRandom(0));
    expect(broken(2, null)).toBe(1_000);
    expect(retryDelayFor(() => -5, 'q', fixedRandom(0))(1, null)).toBe(500);
  });

  it('rejects invalid policies at boot with the place and the rule', () => {
    expect(() => retryDelayFor({ type: 'fixed', delayMs: -1 }, "queues['a']")).toThrow(
      /queues\['a'\]\.backoff\.delayMs must be an integer from 0/,
    );
    expect(() => retryDelayFor({ type: 'exponential', factor: 0.5 }, 'q')).toThrow(/backoff\.factor/);
    expect(() => retryDelayFor({ type: 'linear' } as never, 'q')).toThrow(SqlQueueConfigError);
    expect(() => retryDelayFor({ type: 'exponential', baseMs: 10_000, maxMs: 10 }, 'q')).toThrow(/maxMs/);
  });

  it('jitter stays within its documented range', () => {
    for (const r of [0, 0.25, 0.5, 0.999]) {
      expect(withJitter(1000, 'equal', () => r)).toBeGreaterThanOrEqual(500);
      expect(withJitter(1000, 'equal', () => r)).toBeLessThanOrEqual(1000);
      expect(withJitter(1000, 'full', () => r)).toBeLessThanOrEqual(1000);
      expect(withJitter(1000, 'none', () => r)).toBe(1000);
    }
  });
});

describe('empty-poll backoff', () => {
  it('doubles from min to max, adds at most 25% jitter, never exceeds max, and resets on work', () => {
    const noJitter = new PollBackoff(50, 1_000, fixedRandom(0));
    expect(Array.from({ length: 7 }, () => noJitter.next())).toEqual([50, 100, 200, 400, 800, 1_000, 1_000]);
    noJitter.reset();
    expect(noJitter.next()).toBe(50);
    const maxJitter = new PollBackoff(50, 1_000, fixedRandom(1));
    expect(Array.from({ length: 7 }, () => maxJitter.next())).toEqual([63, 125, 250, 500, 1_000, 1_000, 1_000]);
  });

  it('never pauses less than minPollMs, so an idle reader cannot hot-loop', () => {
    const backoff = new PollBackoff(20, 20, Math.random);
    for (let i = 0; i < 100; i++) expect(backoff.next()).toBe(20);
  });
});
