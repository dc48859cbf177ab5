import { expect, it } from 'vitest';
import { QueueProducer, type ScheduleCatchUp, type ScheduleDefinition } from '../../lib/src/index.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { queueAppSuite } from '../helpers/queue-app.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * Issue 13: every process down for 10 ticks, then one starts. Downtime is simulated without
 * waiting for it: the schedules are upserted by a boot whose scheduler is off, then one UPDATE
 * moves their next_run_at 10 ticks into the past, as if no instance had run since. Then one
 * application boots (its own upsert keeps the unchanged timings' next_run_at) and fires.
 */
const suite = queueAppSuite('sched_catchup');
const SECOND = 1_000;
const MODES: readonly ScheduleCatchUp[] = ['none', 'last', 'all'];

/** Ticks of the jobs schedule `id` enqueued (from their idempotency keys), oldest first. */
async function ticksOf(id: string): Promise<number[]> {
  const rows = await sql<{ key: string }>(
    PG_URL,
    `SELECT idempotency_key AS key FROM "${suite.schema}".jobs WHERE idempotency_key LIKE $1 ORDER BY idempotency_key`,
    [`schedule:${id}:%`],
  );
  return rows.map((row) => Date.parse(row.key.slice(`schedule:${id}:`.length)));
}

const consecutive = (ticks: number[]) => ticks.every((tick, i) => i === 0 || tick - ticks[i - 1]! === SECOND);

it('after 10 missed ticks, one process starting fires none: 0, last: 1, all: 10 of them', async () => {
  // Two every-second schedules per mode: 'sec.*' ('* * * * * *', so regular ticks follow the
  // boot) and 'win.*' (every second of one minute-long window an hour ago: its 10 missed ticks
  // are the whole downtime, and the next tick is a year away, so no regular tick blurs the count).
  const [{ now }] = await sql<{ now: Date }>(PG_URL, 'SELECT now() AS now');
  const windowStart = new Date(Math.floor((now.getTime() - 3_600_000) / 60_000) * 60_000);
  const windowCron = `0-9 ${windowStart.getUTCMinutes()} ${windowStart.getUTCHours()} ${windowStart.getUTCDate()} ${windowStart.getUTCMonth() + 1} *`;
  const schedules: Record<string, ScheduleDefinition> = {};
  for (const catchUp of MODES) {
    schedules[`sec.${catchUp}`] = { cron: '* * * * * *', queue: 'catchup', catchUp };
    schedules[`win.${catchUp}`] = { cron: windowCron, queue: 'catchup', catchUp };
  }
  const module = { queues: { catchup: {} }, schedules };

  const { app: first } = await suite.boot({ module: { ...module, scheduler: { enabled: false } } });
  const upserted = await first.get(QueueProducer).listSchedules();
  expect(upserted.map((s) => s.id)).toEqual(Object.keys(schedules).sort());
  suite.forget(first);
  await first.close();

  // The simulated downtime: every schedule's first unfired tick is 10 ticks before `boot`.
  const [{ boot }] = await sql<{ boot: Date }>(
    PG_URL,
    `UPDATE "${suite.schema}".schedules
        SET next_run_at = CASE WHEN id LIKE 'sec.%' THEN date_trunc('second', now()) - interval '10 seconds' ELSE $1 END
      RETURNING now() AS boot`,
    [windowStart],
  );
  const bootSecond = Math.floor(boot.getTime() / SECOND) * SECOND;

  const { app } = await suite.boot({ module });
  const producer = app.get(QueueProducer);
  // Fired: each window schedule moved on to next year; each every-second schedule has a
  // regular tick after the boot's second.
  await waitFor(
    () => producer.listSchedules(),
    (list) => list.filter((s) => s.id.startsWith('win.')).every((s) => s.nextRunAt!.getTime() > now.getTime()),
    { timeoutMs: 10_000, what: 'the window schedules to fire' },
  );
  for (const catchUp of MODES) {
    await waitFor(
      () => ticksOf(`sec.${catchUp}`),
      (ticks) => ticks.some((tick) => tick > bootSecond),
      { timeoutMs: 10_000, what: `a regular tick of sec.${catchUp}` },
    );
  }

  const window = Array.from({ length: 10 }, (_, i) => windowStart.getTime() + i * SECOND);
  expect(await ticksOf('win.none')).toEqual([]);
  expect(await ticksOf('win.last')).toEqual([window[9]]);
  expect(await ticksOf('win.all')).toEqual(window);
  const list = await producer.listSchedules();
  for (const catchUp of MODES) {
    const record = list.find((s) => s.id === `win.${catchUp}`)!;
    expect(record.nextRunAt!.getTime()).toBeGreaterThan(now.getTime() + 300 * 86_400_000);
    // A tick handled without a job ('none') is not a fire.
    expect(record.lastTick?.getTime() ?? null).toBe(catchUp === 'none' ? null : window[9]);
  }

  // Every second: the downtime's ticks are those before the boot's second.
  const downtime = Array.from({ length: 10 }, (_, i) => bootSecond - (10 - i) * SECOND);
  const all = await ticksOf('sec.all');
  expect(all.filter((tick) => tick < bootSecond)).toEqual(downtime);
  expect(consecutive(all)).toBe(true);
  for (const catchUp of ['none', 'last'] as const) {
    const ticks = await ticksOf(`sec.${catchUp}`);
    // No job for the downtime itself: the first job is the latest due tick when the app fired
    // (for 'last' the run for the missed period, for 'none' the current tick, late by the
    // boot), and regular ticks follow it.
    expect(ticks.filter((tick) => tick < bootSecond)).toEqual([]);
    expect(consecutive(ticks)).toBe(true);
  }
});
