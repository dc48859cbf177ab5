/**
 * The scale recommendation (issue 26) as pure functions: the instantaneous rule, and the
 * recommender that keeps it from flapping, driven by a simulated queue on a fake clock (one step a
 * second): load steps up and down, a spike, scale from and to zero. The SQL functions that compute
 * the same rule in the database are held equal to it in test/integration/scale-recommendation.postgres.spec.ts.
 */
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_SCALE_POLICY,
  desiredReaders,
  desiredWorkers,
  resolveScalePolicy,
  ScaleRecommender,
} from '../../lib/src/core/scaling/index.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { IDLE_SCALE_INPUTS } from '../helpers/scale.js';

const idle = IDLE_SCALE_INPUTS;

describe('desiredReaders', () => {
  it('is 0 for an idle queue, the running jobs for a paused one, and at least 1 while work is claimable', () => {
    expect(desiredReaders(idle)).toBe(0);
    expect(desiredReaders({ ...idle, claimable: 1_000, paused: true })).toBe(0);
    // Scaling a paused queue to zero would kill the handlers still running.
    expect(desiredReaders({ ...idle, claimable: 1_000, running: 3, paused: true })).toBe(3);
    // No consumer yet, nothing measured: the default run time (1 s), 3 jobs over 60 s: one reader.
    expect(desiredReaders({ ...idle, claimable: 3 })).toBe(1);
    expect(desiredReaders({ ...idle, claimable: 600 })).toBe(10);
  });

  it('is the average busy readers plus what drains the backlog in targetDrainMs at the measured run time', () => {
    // 30,000 done in 5 minutes, 100 ms each: 10 readers busy on average; 6,000 waiting drain in 60 s with 10 more.
    const busy = { ...idle, running: 10, completedInWindow: 30_000, busyMsInWindow: 3_000_000, claimable: 6_000 };
    expect(desiredReaders(busy)).toBe(20);
    expect(desiredReaders({ ...busy, claimable: 0 })).toBe(10);
    expect(desiredReaders(busy, resolveScalePolicy({ targetDrainMs: 10_000 }))).toBe(70);
    // Never fewer than the jobs running now, and the readers added for a backlog are not counted twice.
    expect(desiredReaders({ ...busy, running: 40, claimable: 0 })).toBe(40);
    expect(desiredReaders({ ...busy, running: 20 })).toBe(20);
    // Completions from processes that do not record busy time yet: the default run time.
    expect(desiredReaders({ ...busy, busyMsInWindow: 0, running: 0 })).toBe(100);
  });

  it('stays within an int, as the SQL functions answer', () => {
    expect(
      desiredReaders({ ...idle, claimable: 1e12, running: 1, completedInWindow: 1, busyMsInWindow: 86_400_000 }),
    ).toBe(2_147_483_647);
    expect(desiredReaders({ ...idle, running: 3e9, paused: true })).toBe(2_147_483_647);
  });

  it('is capped by globalConcurrency, and by what the rate limit lets run at that run time', () => {
    const busy = { ...idle, running: 10, completedInWindow: 30_000, busyMsInWindow: 3_000_000, claimable: 60_000 };
    expect(desiredReaders(busy)).toBe(110);
    expect(desiredReaders({ ...busy, globalConcurrency: 25 })).toBe(25);
    // 50 starts a second at 100 ms each keep 5 busy.
    expect(desiredReaders({ ...busy, rateMax: 50, ratePerMs: 1_000 })).toBe(5);
    expect(desiredReaders({ ...busy, claimable: 1, running: 0, rateMax: 1, ratePerMs: 60_000 })).toBe(1);
  });

  it('pods follow from maxReaders, as KEDA computes them with targetValue = maxReaders', () => {
    expect(desiredWorkers(0, 10)).toBe(0);
    expect(desiredWorkers(1, 10)).toBe(1);
    expect(desiredWorkers(20, 10)).toBe(2);
    expect(desiredWorkers(21, 10)).toBe(3);
  });

  it('refuses a policy that names an unknown option or an impossible value', () => {
    expect(() => resolveScalePolicy({ targetDrainMs: 0 })).toThrow(SqlQueueConfigError);
    expect(() => resolveScalePolicy({ drainMs: 5 } as never)).toThrow(/drainMs/);
    expect(resolveScalePolicy(undefined)).toEqual(DEFAULT_SCALE_POLICY);
  });
});

/**
 * A queue on a fake clock, one step a second: `arrivals(t)` jobs come in, `readers` (the
 * recommendation of the step before) each finish one job per `runMs`. The measured rate and busy
 * time are those of the five whole minutes before the current one, as the throughput table's are
 * (so the measurement lags by up to six minutes, as in production).
 */
function simulate(arrivals: (second: number) => number, seconds: number, runMs = 100) {
  const recommender = new ScaleRecommender(DEFAULT_SCALE_POLICY.scaleDownDelayMs);
  const completions: number[] = [];
  let backlog = 0;
  let readers = 0;
  const trace: { second: number; readers: number; backlog: number; waitSeconds: number }[] = [];
  for (let second = 0; second < seconds; second++) {
    backlog += arrivals(second);
    const capacity = Math.floor((readers * 1_000) / runMs);
    const done = Math.min(backlog, capacity);
    backlog -= done;
    completions.push(done);
    const minute = Math.floor(second / 60);
    const window = completions.slice(Math.max(0, (minute - 5) * 60), minute * 60);
    const completed = window.reduce((a, b) => a + b, 0);
    const running = Math.min(readers, Math.ceil((done * runMs) / 1_000));
    const raw = desiredReaders({
      ...idle,
      claimable: backlog,
      running,
      completedInWindow: completed,
      busyMsInWindow: completed * runMs,
    });
    readers = recommender.observe(second * 1_000, raw);
    // How long the last job waiting would wait at this rate (the backlog's age, roughly).
    const waitSeconds = capacity > 0 ? backlog / capacity : backlog > 0 ? Infinity : 0;
    trace.push({ second, readers, backlog, waitSeconds });
  }
  return trace;
}

/** How often the recommendation changed direction (up then down, or down then up). */
function reversals(values: number[]): number {
  let last = 0;
  let count = 0;
  for (let i = 1; i < values.length; i++) {
    const step = Math.sign(values[i]! - values[i - 1]!);
    if (step !== 0 && last !== 0 && step !== last) count++;
    if (step !== 0) last = step;
  }
  return count;
}

describe('the recommendation over time (simulated queue, 100 ms handlers)', () => {
  it('a step up from zero to 500 jobs/s: scales from zero, converges near 50 readers, keeps the wait under 10 s, without oscillating', () => {
    const trace = simulate((s) => (s < 60 ? 0 : 500), 1_500);
    expect(trace.slice(0, 60).every((t) => t.readers === 0)).toBe(true);
    expect(trace[61]!.readers).toBeGreaterThanOrEqual(1);
    const settled = trace.slice(900);
    for (const t of settled) {
      expect(t.readers).toBeGreaterThanOrEqual(50);
      expect(t.readers).toBeLessThanOrEqual(60);
    }
    expect(Math.max(...trace.slice(120).map((t) => t.waitSeconds))).toBeLessThan(10);
    expect(reversals(settled.map((t) => t.readers))).toBeLessThanOrEqual(2);
  });

  it('a step down from 500 to 50 jobs/s: holds for the scale-down delay, then comes down and stays down', () => {
    const trace = simulate((s) => (s < 900 ? 500 : 50), 2_400);
    const before = trace[899]!.readers;
    // Held within the delay: no step down before the lower figure has lasted scaleDownDelayMs.
    expect(Math.min(...trace.slice(900, 1_100).map((t) => t.readers))).toBeGreaterThanOrEqual(50); // 500 jobs/s × 100 ms
    const after = trace.slice(1_800).map((t) => t.readers);
    expect(Math.max(...after)).toBeLessThan(before / 5);
    expect(Math.min(...after)).toBeGreaterThanOrEqual(5);
    expect(reversals(trace.slice(900).map((t) => t.readers))).toBeLessThanOrEqual(2);
  });

  it('a ten-second spike of 5,000 jobs/s over 100 jobs/s: the backlog drains within a few drain targets, then readers return', () => {
    const trace = simulate((s) => (s >= 600 && s < 610 ? 5_000 : 100), 1_800);
    const peak = Math.max(...trace.map((t) => t.backlog));
    // The peak asks for about what drains it: 10 readers of steady load plus peak × 100 ms / 60 s,
    // not a multiple (readers added for the backlog are not counted again as load).
    const peakReaders = Math.max(...trace.map((t) => t.readers));
    expect(peakReaders).toBeLessThanOrEqual(2 * (10 + Math.ceil((peak * 100) / 60_000)));
    expect(peak).toBeGreaterThan(10_000); // the readers of 100 jobs/s could not keep up
    const drainedAt = trace.findIndex((t) => t.second > 610 && t.backlog < 100);
    expect(drainedAt - 610).toBeLessThan(180);
    const end = trace.slice(-60).map((t) => t.readers);
    expect(Math.max(...end)).toBeLessThanOrEqual(15);
  });

  it('load that stops: scales to zero once the delay has passed, and stays there', () => {
    const trace = simulate((s) => (s < 600 ? 200 : 0), 1_500);
    expect(trace[620]!.readers).toBeGreaterThan(0);
    expect(trace.slice(1_000).every((t) => t.readers === 0 && t.backlog === 0)).toBe(true);
  });

  it('an oscillating input gets its peak, not the oscillation', () => {
    const recommender = new ScaleRecommender(60_000);
    const out = Array.from({ length: 600 }, (_, s) => recommender.observe(s * 1_000, s % 20 < 10 ? 40 : 10));
    expect(out.slice(20).every((v) => v === 40)).toBe(true);
  });
});
