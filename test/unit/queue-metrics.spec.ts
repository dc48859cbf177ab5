import { describe, expect, it } from 'vitest';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import {
  SharedReading,
  emptyQueueHealth,
  LatencyHistogram,
  QueueEventMetrics,
  QueueHealthReader,
  resolveMetricsOptions,
} from '../../lib/src/core/metrics/queue-metrics.js';
import type { QueueHealth, QueueHealthRequest } from '../../lib/src/core/types.js';
import { deferred } from '../helpers/wait-for.js';

function health(queue: string, ready = 0): QueueHealth {
  return { ...emptyQueueHealth(queue), ready };
}

describe('LatencyHistogram', () => {
  it('keeps cumulative buckets, a sum and a count; +Inf is the count', () => {
    const histogram = new LatencyHistogram([0.1, 1, 10]);
    for (const seconds of [0.05, 0.1, 0.5, 5, 50, -1, Number.NaN]) histogram.observe(seconds);
    expect(histogram.snapshot()).toEqual({
      buckets: [
        { le: 0.1, count: 2 },
        { le: 1, count: 3 },
        { le: 10, count: 4 },
      ],
      sum: 55.65,
      count: 5,
    });
  });
});

describe('QueueEventMetrics', () => {
  it('counts the engine events per queue', () => {
    const metrics = new QueueEventMetrics([1, 10]);
    metrics.claimed({ queue: 'a', count: 3 });
    metrics.emptyClaim({ queue: 'a' });
    metrics.completed({ queue: 'a', enqueueToDoneMs: 2_500, claimToDoneMs: 400 });
    metrics.failed({ queue: 'a', dead: false });
    metrics.failed({ queue: 'a', dead: true });
    metrics.lostOwnership({ queue: 'a', during: 'complete' });
    metrics.abandoned({ queue: 'a' });
    metrics.canceled({ queue: 'a' });
    metrics.rateLimited({ queue: 'a' });
    metrics.readersChanged({ queue: 'a', readers: 1, reason: 'start' });
    metrics.readersChanged({ queue: 'a', readers: 2, reason: 'activation' });
    metrics.readersChanged({ queue: 'a', readers: 1, reason: 'retire' });
    metrics.claimed({ queue: 'b', count: 1 });
    const a = metrics.figures('a');
    expect(a).toMatchObject({
      claims: 1,
      claimedJobs: 3,
      emptyClaims: 1,
      completed: 1,
      retried: 1,
      deadLettered: 1,
      lostOwnership: { heartbeat: 0, complete: 1, fail: 0, release: 0 },
      abandoned: 1,
      canceled: 1,
      rateLimited: 1,
      readerActivations: 1,
      readerRetirements: 1,
      readers: 1,
    });
    expect(a.enqueueToDone).toMatchObject({
      count: 1,
      sum: 2.5,
      buckets: [
        { le: 1, count: 0 },
        { le: 10, count: 1 },
      ],
    });
    expect(a.claimToDone).toMatchObject({ count: 1, sum: 0.4 });
    expect(metrics.queueNames()).toEqual(['a', 'b']);
    // A queue without events reads as zeros, and asking does not register it.
    expect(metrics.figures('c')).toMatchObject({ completed: 0, readers: null });
    expect(metrics.queueNames()).toEqual(['a', 'b']);
  });
});

describe('resolveMetricsOptions', () => {
  it('fills defaults', () => {
    expect(resolveMetricsOptions(undefined)).toMatchObject({
      failureWindowMs: 900_000,
      repeatedFailures: 3,
      cacheMs: 5_000,
      timeoutMs: 3_000,
    });
  });

  it('refuses unknown keys, bad numbers and unordered buckets, naming the option', () => {
    expect(() => resolveMetricsOptions({ window: 1 } as never)).toThrow(/metrics: unknown option 'window'/);
    expect(() => resolveMetricsOptions({ repeatedFailures: 0 })).toThrow(/metrics\.repeatedFailures/);
    expect(() => resolveMetricsOptions({ latencyBucketsSeconds: [1, 1] })).toThrow(SqlQueueConfigError);
    expect(() => resolveMetricsOptions({ latencyBucketsSeconds: [] })).toThrow(/latencyBucketsSeconds/);
  });
});

describe('QueueHealthReader', () => {
  const options = resolveMetricsOptions({ cacheMs: 1_000, timeoutMs: 50 });

  it('reuses a fresh reading and shares one statement between concurrent callers', async () => {
    let now = 0;
    const requests: QueueHealthRequest[] = [];
    const store = {
      async queueHealth(request: QueueHealthRequest) {
        requests.push(request);
        return [health('a', requests.length)];
      },
    };
    const reader = new QueueHealthReader(store, options, () => now);
    const [one, two] = await Promise.all([reader.read(), reader.read()]);
    expect(one).toBe(two);
    expect(requests).toEqual([{ failureWindowMs: 900_000, repeatedFailures: 3 }]);
    now = 900;
    expect((await reader.read()).queues[0]!.ready).toBe(1);
    now = 1_001;
    expect((await reader.read()).queues[0]!.ready).toBe(2);
    expect((await reader.read(0)).queues[0]!.ready).toBe(3);
  });

  it('answers "not ok" in bounded time when the statement hangs, and does not pile up statements', async () => {
    const hanging = deferred<QueueHealth[]>();
    let calls = 0;
    const reader = new QueueHealthReader(
      {
        queueHealth: () => {
          calls++;
          return hanging.promise;
        },
      },
      options,
    );
    const startedAt = Date.now();
    const first = await reader.read();
    expect(Date.now() - startedAt).toBeLessThan(1_000);
    expect(first).toMatchObject({ ok: false, readAt: null, queues: [], error: expect.stringMatching(/timed out/) });
    await reader.read();
    expect(calls).toBe(1);
    hanging.resolve([health('late')]);
    await new Promise((resolve) => setImmediate(resolve));
    expect((await reader.read()).queues.map((q) => q.queue)).toEqual(['late']);
  });

  it('turns a failing statement into a reading with the error, never a throw', async () => {
    const reader = new QueueHealthReader(
      { queueHealth: () => Promise.reject(new Error('connection refused')) },
      options,
    );
    await expect(reader.read()).resolves.toMatchObject({ ok: false, error: 'connection refused' });
  });
});

describe('SharedReading', () => {
  it('shares one reading for maxAgeMs, reads again after it, and never reuses a failed one', async () => {
    let now = 0;
    const results = [
      { ok: true, n: 1 },
      { ok: false, n: 2 },
      { ok: true, n: 3 },
    ];
    let reads = 0;
    const shared = new SharedReading(
      async () => results[reads++]!,
      5_000,
      () => now,
    );
    expect(await shared.get()).toEqual({ ok: true, n: 1 });
    now = 4_999;
    expect(await shared.get()).toEqual({ ok: true, n: 1 });
    expect(reads).toBe(1);
    now = 5_000;
    expect(await shared.get()).toEqual({ ok: false, n: 2 });
    now = 5_001; // well within maxAgeMs of the failed reading
    expect(await shared.get()).toEqual({ ok: true, n: 3 });
    expect(reads).toBe(3);
  });
});
