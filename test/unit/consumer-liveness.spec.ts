import { describe, expect, it } from 'vitest';
import { assessConsumerLiveness, defaultStalledAfterMs } from '../../lib/src/core/consumer/consumer-liveness.js';
import type { ConsumerSnapshot } from '../../lib/src/core/consumer/consumer.js';
import type { QueueConsumerSnapshot } from '../../lib/src/core/consumer/queue-consumer.js';

const NOW = 1_000_000;

function queue(overrides: Partial<QueueConsumerSnapshot>): QueueConsumerSnapshot {
  return {
    queue: 'q',
    readers: 1,
    running: 0,
    buffered: 0,
    lastLoopAt: NOW - 1_000,
    claimFailing: false,
    stopping: false,
    maxPollMs: 2_000,
    maxReaders: 5,
    ...overrides,
  };
}

function assess(queues: QueueConsumerSnapshot[], running = true) {
  const snapshot: ConsumerSnapshot = { running, startedAt: NOW - 3_600_000, queues };
  return assessConsumerLiveness(snapshot, NOW, () => 60_000);
}

describe('consumer liveness (from the snapshot alone)', () => {
  it("is live while an idle reader's claim loop keeps moving, even when every claim fails", () => {
    const verdict = assess([queue({ claimFailing: true, lastLoopAt: NOW - 5_000 })]);
    expect(verdict).toMatchObject({ live: true, running: true, reason: null });
    expect(verdict.queues[0]).toMatchObject({ idleReaders: 1, claimFailing: true, wedged: false });
  });

  it('is not live when a reader waits and the claim loop has not moved for longer than the limit', () => {
    const verdict = assess([queue({ lastLoopAt: NOW - 61_000 }), queue({ queue: 'other' })]);
    expect(verdict.live).toBe(false);
    expect(verdict.reason).toMatch(/queue 'q': the claim loop made no progress for 61 s \(limit 60 s\)/);
    expect(verdict.queues.map((q) => q.wedged)).toEqual([true, false]);
  });

  it('is live when every reader is busy, however long ago the loop last claimed', () => {
    expect(assess([queue({ readers: 3, running: 3, lastLoopAt: NOW - 3_000_000 })]).live).toBe(true);
  });

  it('is live when a job is buffered for the waiting reader', () => {
    expect(assess([queue({ buffered: 2, lastLoopAt: NOW - 3_000_000 })]).live).toBe(true);
  });

  it('is not live when a running queue has no reader left', () => {
    expect(assess([queue({ readers: 0 })])).toMatchObject({ live: false, reason: "queue 'q' has no reader running" });
  });

  it('does not call a stopping queue wedged, but a consumer that is not running is not live', () => {
    expect(assess([queue({ readers: 0, stopping: true, lastLoopAt: 0 })]).live).toBe(true);
    expect(assess([queue({})], false)).toMatchObject({ live: false, reason: 'the queue consumer is not running' });
  });

  it("defaults the limit to a minute, or three of the queue's longest idle pauses", () => {
    expect(defaultStalledAfterMs(2_000)).toBe(60_000);
    expect(defaultStalledAfterMs(300_000)).toBe(900_000);
  });
});
