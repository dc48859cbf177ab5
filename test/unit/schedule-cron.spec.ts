import { describe, expect, it } from 'vitest';
import { SqlQueueConfigError, SqlQueueValidationError } from '../../lib/src/core/errors.js';
import {
  assertCron,
  latestTick,
  latestTicks,
  nextTick,
  ticksBetween,
} from '../../lib/src/core/schedules/schedule-cron.js';

const at = (iso: string) => new Date(iso);
const iso = (dates: readonly Date[]) => dates.map((d) => d.toISOString());

describe('assertCron', () => {
  it('takes 5 and 6 fields, presets and IANA zones', () => {
    for (const [cron, zone] of [
      ['30 2 * * *', 'Europe/Stockholm'],
      ['*/5 * * * * *', 'UTC'],
      ['@daily', 'America/New_York'],
      ['0 9 * * mon-fri', 'Asia/Tokyo'],
    ] as const) {
      expect(() => assertCron('schedule x', cron, zone)).not.toThrow();
    }
  });

  it.each([
    ['* * * *', /cron expression '\* \* \* \*' is invalid: Too few fields/],
    ['* * * * * * *', /Too many fields/],
    ['61 * * * *', /'61 \* \* \* \*' is invalid: Field value \(61\) is out of range/],
    ['*/0 * * * *', /step of zero/],
    ['every day', /'every day' is invalid/],
    ['0 0 30 2 *', /'0 0 30 2 \*' never fires/],
    ['', /cron must be a non-empty string/],
  ])('refuses %j, naming it and what is wrong', (cron, message) => {
    expect(() => assertCron("schedule 'report'", cron, 'UTC')).toThrow(SqlQueueValidationError);
    expect(() => assertCron("schedule 'report'", cron, 'UTC')).toThrow(message);
    expect(() => assertCron("schedule 'report'", cron, 'UTC')).toThrow(/^schedule 'report': /);
  });

  it('refuses a non-string expression', () => {
    expect(() => assertCron('schedule x', 5, 'UTC')).toThrow(/cron must be a non-empty string .*got 5/);
  });

  it.each(['Mars/Olympus', 'local', 'system', 'UTC+2', '+02:00', ''])('refuses the zone %j, naming it', (zone) => {
    expect(() => assertCron('schedule x', '* * * * *', zone)).toThrow(
      zone === '' ? 'timezone must be an IANA time zone name' : `timezone '${zone}' is not a known IANA time zone`,
    );
  });

  it('names an unknown zone', () => {
    expect(() => assertCron('schedule x', '* * * * *', 'Mars/Olympus')).toThrow(
      "schedule x: timezone 'Mars/Olympus' is not a known IANA time zone",
    );
  });

  it('raises the error class it is given (config errors at boot)', () => {
    expect(() => assertCron('schedules.x', 'nope', 'UTC', SqlQueueConfigError)).toThrow(SqlQueueConfigError);
  });
});

describe('nextTick', () => {
  it('is strictly after the given time', () => {
    expect(nextTick('0 * * * *', 'UTC', at('2026-05-01T10:00:00.000Z'))).toEqual(at('2026-05-01T11:00:00.000Z'));
    expect(nextTick('0 * * * *', 'UTC', at('2026-05-01T09:59:59.999Z'))).toEqual(at('2026-05-01T10:00:00.000Z'));
    expect(nextTick('* * * * * *', 'UTC', at('2026-05-01T10:00:00.000Z'))).toEqual(at('2026-05-01T10:00:01.000Z'));
    expect(nextTick('* * * * * *', 'UTC', at('2026-05-01T10:00:00.500Z'))).toEqual(at('2026-05-01T10:00:01.000Z'));
  });

  it('reads the expression in its zone', () => {
    expect(nextTick('30 2 * * *', 'America/New_York', at('2026-06-01T00:00:00Z'))).toEqual(
      at('2026-06-01T06:30:00.000Z'),
    );
    expect(nextTick('30 2 * * *', 'Asia/Tokyo', at('2026-06-01T00:00:00Z'))).toEqual(at('2026-06-01T17:30:00.000Z'));
  });

  it('is null when the expression has no later tick', () => {
    expect(nextTick('0 0 30 2 *', 'UTC', at('2026-01-01T00:00:00Z'))).toBeNull();
  });

  it('a 6-field every-second expression ticks every second', () => {
    expect(
      iso(ticksBetween('* * * * * *', 'UTC', at('2026-05-01T10:00:00Z'), at('2026-05-01T10:00:04Z'), 100)),
    ).toEqual([
      '2026-05-01T10:00:00.000Z',
      '2026-05-01T10:00:01.000Z',
      '2026-05-01T10:00:02.000Z',
      '2026-05-01T10:00:03.000Z',
      '2026-05-01T10:00:04.000Z',
    ]);
  });
});

/** Every tick of a schedule over a range, each from the one before (as the scheduler advances). */
function chain(cron: string, zone: string, from: string, to: string): string[] {
  return iso(ticksBetween(cron, zone, at(from), at(to), 10_000));
}

describe('DST: the two transition days of Europe/Stockholm (2026-03-29 and 2026-10-25)', () => {
  it('a daily 02:30 job fires once on the spring-forward day, at 03:00 CEST (02:30 does not exist)', () => {
    expect(chain('30 2 * * *', 'Europe/Stockholm', '2026-03-28T00:00:00Z', '2026-03-30T23:59:59Z')).toEqual([
      '2026-03-28T01:30:00.000Z', // 02:30 CET
      '2026-03-29T01:00:00.000Z', // 03:00 CEST, right after the gap
      '2026-03-30T00:30:00.000Z', // 02:30 CEST
    ]);
  });

  it('a daily 02:30 job fires once on the fall-back day (02:30 happens twice)', () => {
    expect(chain('30 2 * * *', 'Europe/Stockholm', '2026-10-24T00:00:00Z', '2026-10-26T23:59:59Z')).toEqual([
      '2026-10-24T00:30:00.000Z', // 02:30 CEST
      '2026-10-25T00:30:00.000Z', // 02:30 CEST, the first of the two
      '2026-10-26T01:30:00.000Z', // 02:30 CET
    ]);
  });

  it('an hourly job ticks every real hour: 23 on the spring-forward day, 25 on the fall-back day', () => {
    const spring = chain('0 * * * *', 'Europe/Stockholm', '2026-03-28T23:00:00Z', '2026-03-29T21:59:59Z');
    expect(spring).toHaveLength(23);
    const fall = chain('0 * * * *', 'Europe/Stockholm', '2026-10-24T22:00:00Z', '2026-10-25T22:59:59Z');
    expect(fall).toHaveLength(25);
    // Each an hour after the one before, across both changes: no gap, no double.
    for (const ticks of [spring, fall]) {
      for (let i = 1; i < ticks.length; i++) {
        expect(Date.parse(ticks[i]!) - Date.parse(ticks[i - 1]!)).toBe(3_600_000);
      }
    }
    expect(fall.slice(2, 5)).toEqual([
      '2026-10-25T00:00:00.000Z', // 02:00 CEST
      '2026-10-25T01:00:00.000Z', // 02:00 CET
      '2026-10-25T02:00:00.000Z', // 03:00 CET
    ]);
  });

  it('America/New_York: 02:30 daily once on 2026-03-08 and 01:30 daily once on 2026-11-01', () => {
    expect(chain('30 2 * * *', 'America/New_York', '2026-03-07T12:00:00Z', '2026-03-09T12:00:00Z')).toEqual([
      '2026-03-08T07:00:00.000Z', // 03:00 EDT
      '2026-03-09T06:30:00.000Z',
    ]);
    expect(chain('30 1 * * *', 'America/New_York', '2026-10-31T12:00:00Z', '2026-11-02T12:00:00Z')).toEqual([
      '2026-11-01T05:30:00.000Z', // 01:30 EDT, the first of the two
      '2026-11-02T06:30:00.000Z',
    ]);
  });
});

describe('ticksBetween', () => {
  it('includes both ends and stops at max', () => {
    const from = at('2026-05-01T10:00:00Z');
    const to = at('2026-05-01T10:05:00Z');
    expect(ticksBetween('* * * * *', 'UTC', from, to, 100)).toHaveLength(6);
    expect(iso(ticksBetween('* * * * *', 'UTC', from, to, 2))).toEqual([
      '2026-05-01T10:00:00.000Z',
      '2026-05-01T10:01:00.000Z',
    ]);
    expect(ticksBetween('0 0 * * *', 'UTC', from, to, 100)).toEqual([]);
  });
});

describe('latestTick and latestTicks', () => {
  it('finds the latest tick in a range without walking every tick', () => {
    const from = at('2026-01-01T00:00:00Z');
    const to = at('2026-07-01T12:34:56.789Z');
    const started = performance.now();
    expect(latestTick('* * * * * *', 'Europe/Stockholm', from, to)).toEqual(at('2026-07-01T12:34:56.000Z'));
    expect(latestTick('0 30 2 * * *', 'Europe/Stockholm', from, to)).toEqual(at('2026-07-01T00:30:00.000Z'));
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(latestTick('0 0 * * *', 'UTC', at('2026-05-01T00:00:01Z'), at('2026-05-01T23:59:59Z'))).toBeNull();
    expect(latestTick('0 0 * * *', 'UTC', at('2026-05-01T00:00:00Z'), at('2026-05-01T00:00:00Z'))).toEqual(
      at('2026-05-01T00:00:00Z'),
    );
  });

  it('gives the latest n ticks, oldest first, equal to the tail of the full walk', () => {
    for (const [cron, zone, from, to] of [
      ['* * * * * *', 'UTC', '2026-05-01T00:00:00Z', '2026-05-01T00:20:00Z'],
      ['*/7 * * * *', 'Europe/Stockholm', '2026-10-24T12:00:00Z', '2026-10-26T00:00:00Z'],
      // Dense in one hour a day, sparse elsewhere: the window sizing must adapt.
      ['*/5 * 3 * * *', 'UTC', '2026-05-01T00:00:00Z', '2026-05-03T05:00:00Z'],
      ['0 0 * * *', 'UTC', '2026-05-01T00:00:00Z', '2026-05-05T00:00:00Z'],
    ] as const) {
      const all = ticksBetween(cron, zone, at(from), at(to), 100_000);
      expect(iso(latestTicks(cron, zone, at(from), at(to), 300)), cron).toEqual(iso(all.slice(-300)));
    }
  });

  it('agrees with the tick-by-tick walk over a repeated DST hour (the search must not land in its second occurrence)', () => {
    // America/New_York falls back on 2025-11-02 at 06:00Z (02:00 EDT → 01:00 EST): 01:00–01:59
    // happens twice. The chain of ticks fires each repeated wall-clock time once, at its first
    // occurrence; asked from inside the second, the cron package answers with the second.
    for (const [cron, zone, from, to] of [
      ['0 30 1 * * *', 'America/New_York', '2025-11-01T00:00:00Z', '2025-11-02T07:00:00Z'],
      ['0 */15 1 * * *', 'America/New_York', '2025-11-01T00:00:00Z', '2025-11-02T06:50:00Z'],
      ['0 30 2 * * *', 'Europe/Stockholm', '2026-10-24T00:00:00Z', '2026-10-25T01:45:00Z'],
      ['0 * * * * *', 'Europe/Stockholm', '2026-10-25T00:10:00Z', '2026-10-25T01:20:30Z'],
    ] as const) {
      const walked = ticksBetween(cron, zone, at(from), at(to), 100_000);
      expect(latestTick(cron, zone, at(from), at(to))?.toISOString(), `${cron} ${zone}`).toBe(
        walked.at(-1)?.toISOString(),
      );
    }
    expect(
      latestTick('0 30 1 * * *', 'America/New_York', at('2025-11-01T00:00:00Z'), at('2025-11-02T07:00:00Z')),
    ).toEqual(at('2025-11-02T05:30:00Z'));
    // A range that starts inside the repeated hour has its second occurrence as its own ticks.
    expect(
      latestTick('0 30 1 * * *', 'America/New_York', at('2025-11-02T06:10:00Z'), at('2025-11-02T07:00:00Z')),
    ).toEqual(at('2025-11-02T06:30:00Z'));
  });

  it('walks about n ticks for a long range of an every-second schedule', () => {
    const started = performance.now();
    const ticks = latestTicks('* * * * * *', 'UTC', at('2026-04-01T00:00:00Z'), at('2026-05-01T00:00:00.250Z'), 1000);
    expect(ticks).toHaveLength(1000);
    expect(ticks[999]).toEqual(at('2026-05-01T00:00:00.000Z'));
    expect(ticks[0]).toEqual(at('2026-04-30T23:43:21.000Z'));
    expect(performance.now() - started).toBeLessThan(5_000);
  });
});
