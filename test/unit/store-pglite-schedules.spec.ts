import { PGlite } from '@electric-sql/pglite';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ScheduleFiring, ScheduleRow, ScheduleUpsert } from '../../lib/src/core/schedules/schedule.types.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../lib/src/store/postgres/postgres.store.js';
import { HOUR_MS as HOUR, later, tickJob } from '../helpers/schedules.js';

/**
 * The PostgreSQL ScheduleStore on PGlite (one session, its own transaction API): the shared
 * contract runs on pg.Pool only, so the firing transaction is checked here on the other driver.
 */
let store: PostgresQueueStore;

beforeAll(async () => {
  store = createPostgresStore({ pglite: await PGlite.create(), ownsDb: true }, { schema: 'sched' });
  await store.migrate('auto');
});
afterAll(() => store.close());

const upsert = (id: string, queue: string, nextRunAt: Date | null, options = '{}'): ScheduleUpsert => ({
  id,
  queue,
  cron: '* * * * *',
  timezone: 'UTC',
  payload: '{"n":1}',
  options,
  catchUp: 'all',
  source: 'options',
  nextRunAt,
});

it('pglite: fires in one transaction (grouped jobs, a tick already queued), a throwing plan rolls back', async () => {
  const { now, dueInMs } = await store.scheduleDueIn();
  expect(dueInMs).toBeNull();
  const ticks = [later(now, -120_000), later(now, -60_000)];
  await store.upsertSchedules([upsert('pg.lite', 'lite.q', ticks[0]!, '{"groupKey":"g"}')]);
  expect(typeof (await store.scheduleDueIn()).dueInMs).toBe('number');
  expect((await store.scheduleDueIn()).dueInMs).toBeLessThanOrEqual(0);

  const plan = (rows: readonly ScheduleRow[], at: Date): ScheduleFiring[] =>
    rows.map((row) => ({
      id: row.id,
      jobs: ticks.map((tick) => tickJob(row, tick)),
      nextRunAt: later(at, HOUR),
      lastTick: ticks[1]!,
    }));
  await expect(
    store.fireDueSchedules(10, () => {
      throw new Error('plan failed');
    }),
  ).rejects.toThrow('plan failed');
  expect((await store.getSchedule('pg.lite'))!.nextRunAt).toEqual(ticks[0]);

  const row = (await store.getSchedule('pg.lite'))!;
  const [existing] = await store.enqueue([tickJob(row, ticks[1]!)]);
  const fired = await store.fireDueSchedules(10, plan);
  expect(fired.map((firing) => firing.id)).toEqual(['pg.lite']);
  expect((await store.stats('lite.q')).ready).toBe(2);
  const after = (await store.getSchedule('pg.lite'))!;
  expect(after.lastTick).toEqual(ticks[1]);
  expect(after.nextRunAt!.getTime()).toBeGreaterThan(now.getTime());

  // The group's jobs run one at a time, the job queued before the firing first.
  const [head] = await store.claim({ queue: 'lite.q', limit: 10, leaseMs: 30_000, workerId: 'w' });
  expect(head!.id).toBe(existing!.jobId);
  expect(await store.claim({ queue: 'lite.q', limit: 10, leaseMs: 30_000, workerId: 'w' })).toEqual([]);
});

it('pglite: resuming a schedule that is not paused keeps its next run (a tick due now is not skipped)', async () => {
  const { now } = await store.scheduleDueIn();
  const due = later(now, -1000);
  await store.upsertSchedules([upsert('pg.resume', 'lite.r', due)]);
  expect(await store.setSchedulePaused('pg.resume', false, later(now, HOUR))).toBe(true);
  expect((await store.getSchedule('pg.resume'))!.nextRunAt).toEqual(due);
  // Pausing keeps the time too; resuming from paused takes the one given.
  await store.setSchedulePaused('pg.resume', true, null);
  expect((await store.getSchedule('pg.resume'))!.nextRunAt).toEqual(due);
  await store.setSchedulePaused('pg.resume', false, later(now, HOUR));
  expect((await store.getSchedule('pg.resume'))!).toMatchObject({ paused: false, nextRunAt: later(now, HOUR) });
  // The options source pruned to nothing: both schedules go.
  await store.upsertSchedules([], 'options');
  expect(await store.listSchedules()).toEqual([]);
});
