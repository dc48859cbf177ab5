import { afterEach, describe, expect, it } from 'vitest';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import { toScheduleUpsert } from '../../lib/src/core/schedules/schedule-options.js';
import { SqlQueueScheduler } from '../../lib/src/core/schedules/scheduler.js';
import type { ScheduleDefinition } from '../../lib/src/core/schedules/schedule.types.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { ScheduleStoreDouble } from '../helpers/schedule-store-double.js';

const lines = (logger: CaptureLogger, level: string) =>
  logger.lines
    .filter((line) => line.level === level)
    .map((line) => line.message)
    .join('\n');
const BASE = Date.parse('2026-05-01T10:00:00.000Z');
const running: SqlQueueScheduler[] = [];

afterEach(async () => {
  await Promise.all(running.splice(0).map((scheduler) => scheduler.stop()));
});

function setup(options: { maxPollMs?: number; minPollMs?: number; batch?: number } = {}) {
  const clock = new FakeClock();
  const store = new ScheduleStoreDouble(() => new Date(BASE + clock.now()));
  const logger = new CaptureLogger();
  const fired: Parameters<NonNullable<QueueEventListener['scheduleFired']>>[0][] = [];
  const scheduler = new SqlQueueScheduler({
    store,
    clock,
    logger,
    listeners: [{ scheduleFired: (event) => fired.push(event) }],
    maxPollMs: options.maxPollMs ?? 10_000,
    minPollMs: options.minPollMs ?? 1_000,
    batch: options.batch,
    defaultMaxAttemptsFor: () => 25,
    random: () => 0,
  });
  running.push(scheduler);
  const schedule = (id: string, definition: ScheduleDefinition) =>
    store.upsertSchedules([toScheduleUpsert(id, definition, 'api', store.now(), 1024)]);
  return { clock, store, logger, fired, scheduler, schedule };
}

describe('SqlQueueScheduler', () => {
  it('costs one scheduleDueIn per 30 s while there is no schedule at all', async () => {
    const { clock, store, scheduler } = setup({ maxPollMs: 5_000 });
    scheduler.start();
    await clock.advance(0);
    expect(store.calls.scheduleDueIn).toBe(1);
    await clock.advance(60_000);
    expect(store.calls.scheduleDueIn).toBe(3);
    expect(store.calls.fireDueSchedules).toBe(0);
  });

  it('costs one scheduleDueIn per maxPollMs when schedules exist and none is due', async () => {
    const { clock, store, scheduler, schedule } = setup({ maxPollMs: 5_000 });
    await schedule('daily', { cron: '0 0 * * *', queue: 'q' });
    scheduler.start();
    await clock.advance(0);
    expect(store.calls.scheduleDueIn).toBe(1);
    await clock.advance(60_000);
    expect(store.calls.scheduleDueIn).toBe(13);
    expect(store.calls.fireDueSchedules).toBe(0);
  });

  it('a schedule made here while there are none is seen at once (wake), not after the 30 s sleep', async () => {
    const { clock, store, scheduler, schedule, fired } = setup({ maxPollMs: 5_000 });
    scheduler.start();
    await clock.advance(0);
    await schedule('every', { cron: '* * * * * *', queue: 'q' });
    scheduler.wake();
    await clock.advance(2_000);
    expect(fired.length).toBeGreaterThanOrEqual(1);
    expect(store.calls.scheduleDueIn).toBeGreaterThanOrEqual(2);
  });

  it('a schedule due later than maxPollMs still costs one statement per maxPollMs until it is near', async () => {
    const { clock, store, scheduler, schedule } = setup({ maxPollMs: 5_000 });
    await schedule('hourly', { cron: '0 * * * *', queue: 'q' }); // due in an hour
    scheduler.start();
    await clock.advance(30_000);
    expect(store.calls.scheduleDueIn).toBe(7);
    expect(store.calls.fireDueSchedules).toBe(0);
  });

  it('fires a due schedule once per tick, sleeping until each tick', async () => {
    const { clock, store, fired, scheduler, schedule } = setup({ maxPollMs: 10_000 });
    await schedule('every-2s', { cron: '*/2 * * * * *', queue: 'q', payload: { a: 1 } });
    scheduler.start();
    await clock.advance(0); // 10:00:00.000 is not after now: the first tick is 10:00:02
    expect(store.jobs).toHaveLength(0);
    await clock.advance(2_000);
    expect(store.jobs.map((job) => job.idempotencyKey)).toEqual(['schedule:every-2s:2026-05-01T10:00:02.000Z']);
    expect(store.jobs[0]).toMatchObject({ queue: 'q', payload: '{"a":1}', defaultMaxAttempts: 25 });
    await clock.advance(8_000);
    expect(store.jobs).toHaveLength(5);
    expect(fired[0]).toEqual({ id: 'every-2s', queue: 'q', ticks: 1, skipped: 0, lagMs: 0 });
    // Per tick: one firing transaction and one look at the next due time.
    expect(store.calls.fireDueSchedules).toBe(5);
    expect(store.calls.scheduleDueIn).toBe(6);
    expect(store.rows.get('every-2s')!.lastTick).toEqual(new Date('2026-05-01T10:00:10.000Z'));
  });

  it('catches up missed ticks at start by catchUp, and reports what it skipped', async () => {
    const { clock, store, fired, scheduler, schedule } = setup();
    await schedule('s', { cron: '* * * * * *', queue: 'q' }); // catchUp 'last'
    await clock.advance(10_500); // nobody ran: ticks 10:00:01 … 10:00:10 missed
    scheduler.start();
    await clock.advance(0);
    expect(store.jobs.map((job) => job.idempotencyKey)).toEqual(['schedule:s:2026-05-01T10:00:10.000Z']);
    expect(fired[0]).toEqual({ id: 's', queue: 'q', ticks: 1, skipped: 9, lagMs: 9_500 });
    expect(store.rows.get('s')!.nextRunAt).toEqual(new Date('2026-05-01T10:00:11.000Z'));
  });

  it('wake() cuts a sleep short so a new schedule is seen at once', async () => {
    const { clock, store, scheduler, schedule } = setup({ maxPollMs: 60_000 });
    scheduler.start();
    await clock.advance(1_000);
    expect(store.calls.scheduleDueIn).toBe(1);
    await schedule('soon', { cron: '*/2 * * * * *', queue: 'q' }); // due at 10:00:02, in 1 s
    scheduler.wake();
    await clock.advance(0);
    expect(store.calls.scheduleDueIn).toBe(2);
    await clock.advance(1_000);
    expect(store.jobs).toHaveLength(1);
  });

  it('a wake() during a look at the schedules makes it look again instead of sleeping', async () => {
    const { clock, store, scheduler } = setup({ maxPollMs: 60_000 });
    const original = store.scheduleDueIn.bind(store);
    let first = true;
    store.scheduleDueIn = async () => {
      const result = await original();
      if (first) {
        first = false;
        scheduler.wake(); // an upsert committed while the statement ran
      }
      return result;
    };
    scheduler.start();
    await clock.advance(0);
    expect(store.calls.scheduleDueIn).toBe(2);
  });

  it('stop() during a sleep returns at once; stop() is idempotent', async () => {
    const { clock, store, scheduler } = setup({ maxPollMs: 60_000 });
    scheduler.start();
    await clock.advance(0);
    let stopped = false;
    const stopping = scheduler.stop().then(() => (stopped = true));
    await clock.advance(0);
    expect(stopped).toBe(true);
    await stopping;
    await scheduler.stop();
    await clock.advance(120_000);
    expect(store.calls.scheduleDueIn).toBe(1);
  });

  it('stop() waits for a round in flight', async () => {
    const { clock, store, scheduler, schedule } = setup();
    await schedule('s', { cron: '* * * * * *', queue: 'q' });
    await clock.advance(1_000);
    let release!: () => void;
    const original = store.fireDueSchedules.bind(store);
    store.fireDueSchedules = async (limit, plan) => {
      await new Promise<void>((resolve) => (release = resolve));
      return original(limit, plan);
    };
    scheduler.start();
    await clock.advance(0);
    let stopped = false;
    const stopping = scheduler.stop().then(() => (stopped = true));
    await clock.advance(0);
    expect(stopped).toBe(false);
    release();
    await stopping;
    expect(store.jobs).toHaveLength(1);
  });

  it('errors are logged with the schedules concerned, backed off, and never stop the loop', async () => {
    const { clock, store, logger, scheduler, schedule } = setup({ maxPollMs: 10_000, minPollMs: 1_000 });
    store.failNext(new Error('connection lost'), 3);
    scheduler.start();
    await clock.advance(0);
    expect(store.calls.scheduleDueIn).toBe(1);
    await clock.advance(999);
    expect(store.calls.scheduleDueIn).toBe(1); // backing off 1 s
    await clock.advance(1);
    expect(store.calls.scheduleDueIn).toBe(2);
    await clock.advance(2_000);
    expect(store.calls.scheduleDueIn).toBe(3); // then 2 s
    await clock.advance(4_000);
    expect(store.calls.scheduleDueIn).toBe(4); // then 4 s, and it works again
    expect(lines(logger, 'error')).toMatch(/scheduler failed: connection lost; retrying in 1000 ms/);
    expect(lines(logger, 'log')).toMatch(/scheduler recovered/);

    await schedule('s', { cron: '* * * * * *', queue: 'q' });
    const original = store.fireDueSchedules.bind(store);
    store.fireDueSchedules = async (_limit, plan) => {
      plan([...store.rows.values()], store.now());
      throw new Error('deadlock victim');
    };
    scheduler.wake();
    await clock.advance(1_000);
    expect(lines(logger, 'error')).toMatch(/firing due schedules \('s'\) failed: deadlock victim/);
    store.fireDueSchedules = original;
    await clock.advance(10_000);
    expect(store.jobs.length).toBeGreaterThan(0);
  });

  it('fires batch after batch while full batches come back', async () => {
    const { clock, store, scheduler, schedule } = setup({ batch: 2 });
    for (const id of ['a', 'b', 'c', 'd', 'e']) await schedule(id, { cron: '0 * * * * *', queue: 'q' });
    await clock.advance(60_000);
    scheduler.start();
    await clock.advance(0);
    expect(store.jobs).toHaveLength(5);
    expect(store.calls.fireDueSchedules).toBe(3);
  });

  it('does not spin while another instance holds the due schedules', async () => {
    const { clock, store, scheduler, schedule } = setup({ maxPollMs: 10_000, minPollMs: 1_000 });
    await schedule('s', { cron: '* * * * * *', queue: 'q' });
    await clock.advance(1_000);
    store.locked.add('s');
    scheduler.start();
    await clock.advance(5_000);
    // Held: fire (0), look, pause 1 s, fire, look, pause 2 s, … not a tight loop.
    expect(store.calls.fireDueSchedules).toBeLessThanOrEqual(4);
    store.locked.delete('s');
    await clock.advance(10_000);
    expect(store.jobs.length).toBeGreaterThan(0);
  });

  it('logs the plan warnings after the commit', async () => {
    const { clock, logger, scheduler, schedule } = setup();
    await schedule('s', { cron: '* * * * * *', queue: 'q', catchUp: 'all' });
    await clock.advance(1_100_000);
    scheduler.start();
    await clock.advance(0);
    expect(lines(logger, 'warn')).toMatch(/schedule 's' missed more than 1000 ticks/);
  });
});
