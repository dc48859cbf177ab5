import { describe, expect, it } from 'vitest';
import type { ThroughputReading } from '../../lib/src/core/types.js';
import { ThroughputCache } from '../../lib/src/dashboard/dashboard.service.js';
import { deferred } from '../helpers/wait-for.js';

describe('dashboard throughput cache', () => {
  const reading = (minutes: number): ThroughputReading => ({ now: new Date(minutes), buckets: [] });

  it('shares one read among concurrent and recent requests of a window, and reads again after maxAgeMs', async () => {
    let now = 0;
    const reads: number[] = [];
    const pending = deferred<ThroughputReading>();
    const cache = new ThroughputCache(
      (minutes) => {
        reads.push(minutes);
        return minutes === 60 && reads.length === 1 ? pending.promise : Promise.resolve(reading(minutes));
      },
      15_000,
      () => now,
    );
    const first = cache.get(60);
    const second = cache.get(60);
    expect(reads).toEqual([60]);
    pending.resolve(reading(60));
    expect(await first).toBe(await second);
    now = 14_999;
    await cache.get(60);
    await cache.get(5);
    expect(reads).toEqual([60, 5]);
    now = 15_000;
    await cache.get(60);
    expect(reads).toEqual([60, 5, 60]);
  });

  it('drops a failed read, so the next request reads again', async () => {
    let calls = 0;
    const cache = new ThroughputCache(
      () => (++calls === 1 ? Promise.reject(new Error('database down')) : Promise.resolve(reading(1))),
      15_000,
      () => 0,
    );
    await expect(cache.get(60)).rejects.toThrow('database down');
    expect(await cache.get(60)).toEqual(reading(1));
    expect(calls).toBe(2);
  });
});
