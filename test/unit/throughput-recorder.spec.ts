import { describe, expect, it } from 'vitest';
import { ThroughputRecorder } from '../../lib/src/core/throughput/index.js';
import type { ThroughputCount } from '../../lib/src/core/types.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { FakeClock } from '../helpers/fake-clock.js';

/** A store that records every flush, and fails while `failing` is set. */
class RecordingStore {
  readonly flushes: ThroughputCount[][] = [];
  failing = false;
  /** Set to hold the next flush open until released. */
  hold: Promise<void> | null = null;

  async recordThroughput(counts: readonly ThroughputCount[]): Promise<void> {
    if (this.hold) await this.hold;
    if (this.failing) throw new Error('connection refused');
    this.flushes.push(counts.map((count) => ({ ...count })));
  }

  total(): Record<string, Omit<ThroughputCount, 'queue'>> {
    const sums: Record<string, Omit<ThroughputCount, 'queue'>> = {};
    for (const count of this.flushes.flat()) {
      const sum = (sums[count.queue] ??= { completed: 0, failed: 0, dead: 0 });
      sum.completed += count.completed;
      sum.failed += count.failed;
      sum.dead += count.dead;
    }
    return sums;
  }
}

function setup() {
  const clock = new FakeClock();
  const store = new RecordingStore();
  const logger = new CaptureLogger();
  const recorder = new ThroughputRecorder({ store, clock, logger, flushIntervalMs: 5_000 });
  recorder.start();
  return { clock, store, logger, recorder };
}

describe('ThroughputRecorder', () => {
  it('sends one statement per interval for every queue, counting completions, retries and deaths apart', async () => {
    const { clock, store, recorder } = setup();
    for (let i = 0; i < 3; i++) recorder.completed({ queue: 'emails', claimToDoneMs: 120.4 });
    recorder.failed({ queue: 'emails', dead: false });
    recorder.failed({ queue: 'reports', dead: true });
    recorder.reaped([
      { id: '1', queue: 'reports', state: 'ready', attempt: 1 },
      { id: '2', queue: 'reports', state: 'dead', attempt: 5 },
    ]);
    await clock.advance(4_999);
    expect(store.flushes).toEqual([]);
    await clock.advance(1);
    expect(store.flushes).toEqual([
      [
        // The handlers' time too, for the scale recommendation's run time.
        { queue: 'emails', completed: 3, failed: 1, dead: 0, busyMs: 360 },
        { queue: 'reports', completed: 0, failed: 1, dead: 2, busyMs: 0 },
      ],
    ]);
  });

  it('sends nothing while idle', async () => {
    const { clock, store, recorder } = setup();
    await clock.advance(60_000);
    expect(store.flushes).toEqual([]);
    recorder.completed({ queue: 'emails' });
    await clock.advance(60_000);
    expect(store.flushes).toHaveLength(1);
  });

  it('keeps the counts of a failed flush for the next one, and logs once while failing', async () => {
    const { clock, store, logger, recorder } = setup();
    store.failing = true;
    recorder.completed({ queue: 'emails' });
    await clock.advance(5_000);
    recorder.completed({ queue: 'emails' });
    await clock.advance(5_000);
    expect(logger.matching(/recording throughput failed/)).toHaveLength(1);
    store.failing = false;
    recorder.failed({ queue: 'emails', dead: false });
    await clock.advance(5_000);
    expect(store.total()).toEqual({ emails: { completed: 2, failed: 1, dead: 0 } });
  });

  it('counts what arrives during a slow flush in the next one, never twice and never lost', async () => {
    const { clock, store, recorder } = setup();
    let release!: () => void;
    store.hold = new Promise((resolve) => (release = resolve));
    recorder.completed({ queue: 'emails' });
    await clock.advance(5_000); // flush 1 starts and waits
    recorder.completed({ queue: 'emails' });
    await clock.advance(5_000); // a tick while flush 1 runs: skipped
    store.hold = null;
    release();
    await clock.advance(5_000);
    expect(store.flushes.map((flush) => flush[0]!.completed)).toEqual([1, 1]);
  });

  it('sends the last counts at stop, and warns when the database does not take them in time', async () => {
    const { store, logger, recorder } = setup();
    recorder.completed({ queue: 'emails' });
    await recorder.stop(1_000);
    expect(store.total()).toEqual({ emails: { completed: 1, failed: 0, dead: 0 } });
    expect(logger.matching(/not recorded/)).toEqual([]);

    const stuck = setup();
    stuck.store.hold = new Promise(() => undefined);
    stuck.recorder.completed({ queue: 'emails' });
    await stuck.recorder.stop(20);
    expect(stuck.logger.matching(/not recorded at shutdown/)).toHaveLength(1);
  });
});
