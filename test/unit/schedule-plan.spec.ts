import { describe, expect, it } from 'vitest';
import { planFirings, type PlanOptions } from '../../lib/src/core/schedules/schedule-plan.js';
import type { ScheduleCatchUp, ScheduleRow } from '../../lib/src/core/schedules/schedule.types.js';

const T0 = new Date('2026-05-01T10:00:00.000Z');
const seconds = (n: number) => new Date(T0.getTime() + n * 1000);

function row(overrides: Partial<ScheduleRow> = {}): ScheduleRow {
  return {
    id: 'tick',
    queue: 'work',
    cron: '* * * * * *',
    timezone: 'UTC',
    payload: '{"n":1}',
    options: '{}',
    catchUp: 'last',
    paused: false,
    source: 'api',
    nextRunAt: T0,
    lastRunAt: null,
    lastTick: null,
    createdAt: T0,
    updatedAt: T0,
    ...overrides,
  };
}

function plan(rows: ScheduleRow[], now: Date, extra: Partial<PlanOptions> = {}) {
  const warnings: string[] = [];
  const firings = planFirings(rows, now, {
    defaultMaxAttemptsFor: (queue) => (queue === 'work' ? 7 : 25),
    onWarning: (message) => warnings.push(message),
    ...extra,
  });
  return { firings, warnings };
}

const keys = (firing: { jobs: { idempotencyKey: string | null }[] }) => firing.jobs.map((job) => job.idempotencyKey);

describe('planFirings: the normal single due tick', () => {
  it('fires it (even a bit late) and moves to the next tick after now', () => {
    const { firings, warnings } = plan([row()], new Date(T0.getTime() + 250));
    expect(firings).toEqual([
      {
        id: 'tick',
        queue: 'work',
        jobs: [
          {
            queue: 'work',
            payload: '{"n":1}',
            priority: 0,
            runAt: null,
            delayMs: 0,
            groupKey: null,
            concurrencyKey: null,
            idempotencyKey: 'schedule:tick:2026-05-01T10:00:00.000Z',
            maxAttempts: null,
            defaultMaxAttempts: 7,
          },
        ],
        nextRunAt: seconds(1),
        lastTick: T0,
        skipped: 0,
        lagMs: 250,
      },
    ]);
    expect(warnings).toEqual([]);
  });

  it('none skips a lone due tick later than the grace, as it skips missed ones (and fires one within it)', () => {
    const hourly = row({ cron: '0 * * * *', catchUp: 'none' });
    const late = plan([hourly], new Date(T0.getTime() + 61_000)).firings[0]!;
    expect(late).toMatchObject({ jobs: [], skipped: 1, nextRunAt: new Date('2026-05-01T11:00:00.000Z') });
    expect(keys(plan([hourly], new Date(T0.getTime() + 59_000)).firings[0]!)).toEqual([
      'schedule:tick:2026-05-01T10:00:00.000Z',
    ]);
  });

  it('fires exactly at the tick, and late by most of a period', () => {
    const hourly = row({ cron: '0 * * * *', catchUp: 'last' });
    for (const now of [T0, new Date(T0.getTime() + 3_599_999)]) {
      const [firing] = plan([hourly], now).firings;
      expect(keys(firing!)).toEqual(['schedule:tick:2026-05-01T10:00:00.000Z']);
      expect(firing!.nextRunAt).toEqual(new Date('2026-05-01T11:00:00.000Z'));
    }
  });

  it("uses the schedule's job options", () => {
    const [firing] = plan(
      [row({ queue: 'other', options: '{"priority":3,"maxAttempts":2,"groupKey":"g"}' })],
      T0,
    ).firings;
    expect(firing!.jobs[0]).toMatchObject({
      queue: 'other',
      priority: 3,
      maxAttempts: 2,
      groupKey: 'g',
      defaultMaxAttempts: 25,
    });
  });

  it('plans nothing for a row that is not due, paused, or has no next run', () => {
    const rows = [row({ nextRunAt: seconds(1) }), row({ paused: true }), row({ nextRunAt: null })];
    expect(plan(rows, T0).firings).toEqual([]);
  });

  it('moves a yearly schedule a year on', () => {
    const [firing] = plan([row({ cron: '0 0 10 1 5 *' })], T0).firings;
    expect(firing!.nextRunAt).toEqual(new Date('2027-05-01T10:00:00.000Z'));
  });
});

describe('planFirings: 10 missed ticks (every instance was down)', () => {
  // Ticks due: 10:00:00 … 10:00:09; now a quarter second after the last.
  const now = new Date(seconds(9).getTime() + 250);

  it.each([
    ['none', ['schedule:tick:2026-05-01T10:00:09.000Z'], 9],
    ['last', ['schedule:tick:2026-05-01T10:00:09.000Z'], 9],
    ['all', Array.from({ length: 10 }, (_, i) => `schedule:tick:2026-05-01T10:00:0${i}.000Z`), 0],
  ] as [ScheduleCatchUp, string[], number][])('%s → %j', (catchUp, fired, skipped) => {
    const { firings, warnings } = plan([row({ catchUp })], now);
    expect(keys(firings[0]!)).toEqual(fired);
    expect(firings[0]).toMatchObject({ nextRunAt: seconds(10), lastTick: seconds(9), skipped, lagMs: 9_250 });
    expect(warnings).toEqual([]);
  });

  it("none fires nothing when the latest missed tick is older than the grace (and 'last' still fires it)", () => {
    const hourly = { cron: '0 * * * *', nextRunAt: new Date('2026-05-01T00:00:00Z') };
    const late = new Date('2026-05-01T09:01:00.001Z'); // 10 ticks due, the latest 60.001 s ago
    const none = plan([row({ ...hourly, catchUp: 'none' })], late).firings[0]!;
    expect(none).toMatchObject({ jobs: [], skipped: 10, lastTick: new Date('2026-05-01T09:00:00Z') });
    expect(none.nextRunAt).toEqual(new Date('2026-05-01T10:00:00Z'));
    const last = plan([row({ ...hourly, catchUp: 'last' })], late).firings[0]!;
    expect(keys(last)).toEqual(['schedule:tick:2026-05-01T09:00:00.000Z']);
    expect(last.skipped).toBe(9);
    // Within the grace it fires.
    const within = plan([row({ ...hourly, catchUp: 'none' })], new Date('2026-05-01T09:01:00.000Z')).firings[0]!;
    expect(keys(within)).toEqual(['schedule:tick:2026-05-01T09:00:00.000Z']);
    // A custom grace.
    const grace = plan([row({ ...hourly, catchUp: 'none' })], late, { graceMs: 120_000 }).firings[0]!;
    expect(grace.jobs).toHaveLength(1);
  });
});

describe("planFirings: catchUp 'all' is capped", () => {
  it('fires the latest 1,000 of 1,010 missed ticks and warns naming the schedule and the 10 dropped', () => {
    const now = new Date(seconds(1009).getTime() + 500);
    const { firings, warnings } = plan([row({ id: 'report.fast', catchUp: 'all' })], now);
    const fired = firings[0]!;
    expect(fired.jobs).toHaveLength(1000);
    expect(fired.jobs[0]!.idempotencyKey).toBe(`schedule:report.fast:${seconds(10).toISOString()}`);
    expect(fired.jobs[999]!.idempotencyKey).toBe(`schedule:report.fast:${seconds(1009).toISOString()}`);
    expect(fired).toMatchObject({ nextRunAt: seconds(1010), lastTick: seconds(1009) });
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain("schedule 'report.fast' missed more than 1000 ticks");
    expect(warnings[0]).toContain('fires the latest 1000 (from 2026-05-01T10:00:10.000Z) and drops the 10 before them');
    expect(fired.skipped).toBe(10);
  });

  it('exactly 1,000 missed ticks fire without a warning', () => {
    const { firings, warnings } = plan([row({ catchUp: 'all' })], seconds(999));
    expect(firings[0]!.jobs).toHaveLength(1000);
    expect(warnings).toEqual([]);
  });

  it('a small cap shows the exact count dropped', () => {
    const { firings, warnings } = plan([row({ id: 's', catchUp: 'all' })], seconds(14), { maxCatchUp: 10 });
    expect(keys(firings[0]!)).toEqual(
      Array.from({ length: 10 }, (_, i) => `schedule:s:${seconds(5 + i).toISOString()}`),
    );
    expect(warnings[0]).toMatch(
      /schedule 's' missed more than 10 ticks .* fires the latest 10 .* drops the (at least )?\d+ before them/,
    );
  });

  it('a week of a missed every-second schedule costs about 1,000 ticks of work, not 604,800', () => {
    const started = performance.now();
    const now = new Date(T0.getTime() + 7 * 86_400_000 + 100);
    const { firings } = plan([row({ catchUp: 'all' }), row({ id: 'l', catchUp: 'last' })], now);
    expect(firings[0]!.jobs).toHaveLength(1000);
    expect(firings[0]!.jobs[999]!.idempotencyKey).toBe(`schedule:tick:${new Date(now.getTime() - 100).toISOString()}`);
    expect(keys(firings[1]!)).toEqual([`schedule:l:${new Date(now.getTime() - 100).toISOString()}`]);
    expect(performance.now() - started).toBeLessThan(5_000);
  });
});

describe('planFirings: a broken row', () => {
  it('is pushed an hour on with a warning, and does not stop the others', () => {
    const { firings, warnings } = plan([row({ id: 'bad', cron: 'nonsense' }), row()], T0);
    expect(firings[0]).toMatchObject({ id: 'bad', jobs: [], nextRunAt: new Date(T0.getTime() + 3_600_000) });
    expect(firings[1]!.jobs).toHaveLength(1);
    expect(warnings[0]).toMatch(/schedule 'bad' \(cron 'nonsense'.* could not be planned/);
  });
});

describe('planFirings: DST', () => {
  it('a daily 02:30 job in Europe/Stockholm fires once on the fall-back day, and next on the day after', () => {
    const daily = row({
      cron: '30 2 * * *',
      timezone: 'Europe/Stockholm',
      nextRunAt: new Date('2026-10-25T00:30:00Z'),
    });
    const [firing] = plan([daily], new Date('2026-10-25T00:30:00.020Z')).firings;
    expect(firing!.jobs).toHaveLength(1);
    expect(firing!.nextRunAt).toEqual(new Date('2026-10-26T01:30:00.000Z'));
  });
});
